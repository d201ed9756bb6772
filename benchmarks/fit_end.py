"""Benchmark: the end of a ``Trainer.fit`` with ``NeuronProfilerCallback``, with a window
still uploading, against the same fit with a plain (empty) callback.

A fit of 320 one-millisecond steps (a tiny model whose ``training_step`` sleeps 1 ms) with
the MLflow logger, each fit in a fresh Python process, the variants interleaved round by
round (the order rotating). The callback's window (steps 307-316, two warm-up steps before)
ends three steps before the fit does, so the worker process is still summarising and
uploading it when training ends. Measured:

- the end: from the last ``on_train_batch_end`` to ``trainer.fit`` returning (Lightning's
  ``on_train_end`` / ``on_fit_end`` hooks, the teardown, the logger's finalize);
- the callback's three step hooks (``on_train_batch_start``, ``on_before_optimizer_step``,
  ``on_train_batch_end``) outside the window, timed directly, in us per step (the plain
  callback's empty hooks are timed the same way: what the timing itself costs);
- whether the window was still being uploaded when ``fit`` returned, and that
  ``callback.wait()`` then lands it in MLflow.

The bars (issue #33): the end at most 0.2 s more than the plain callback's; the hooks at
most 5 us per step.

Run:  .venv/bin/python benchmarks/fit_end.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = 320
WAIT, WARMUP, ACTIVE = 305, 2, 10  # recorded steps 307-316: the window ends 3 steps early
VARIANTS = ("plain callback", "neuron-mlflow")


def child(variant: str, work: str) -> dict[str, object]:
    import torch
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import MLFlowLogger

    import neuron_mlflow as nm
    from neuron_mlflow.schedule import Action, action_at
    from neuron_mlflow.sinks.spool import Spool

    class OneMs(BoringModel):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            time.sleep(0.001)
            return super().training_step(batch, batch_idx)

    class LastBatchEnd(Callback):
        """After every other callback: when the last step's hooks are done."""

        at = 0.0

        def on_train_batch_end(self, *args: object) -> None:
            self.at = time.perf_counter()

    class TimedHooks:
        """The three step hooks of the callback class it is mixed into, timed."""

        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.hook_ns: list[int] = []
            self._ns = 0

        def on_train_batch_start(self, *args: object, **kwargs: object) -> None:
            t0 = time.perf_counter_ns()
            super().on_train_batch_start(*args, **kwargs)  # type: ignore[arg-type]
            self._ns = time.perf_counter_ns() - t0

        def on_before_optimizer_step(self, *args: object, **kwargs: object) -> None:
            t0 = time.perf_counter_ns()
            super().on_before_optimizer_step(*args, **kwargs)  # type: ignore[arg-type]
            self._ns += time.perf_counter_ns() - t0

        def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
            t0 = time.perf_counter_ns()
            super().on_train_batch_end(*args, **kwargs)  # type: ignore[arg-type]
            self.hook_ns.append(self._ns + time.perf_counter_ns() - t0)

    class Timed(TimedHooks, nm.NeuronProfilerCallback):
        pass

    class Plain(TimedHooks, Callback):  # the timing around empty hooks: what it costs
        pass

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spool = Path(work) / "spool"
    schedule = nm.Schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
    ours = None
    callback: Any = Plain()
    if variant == "neuron-mlflow":
        ours = Timed(schedule=schedule, backend="cpu", local_dir=str(spool), strict=False)
        callback = ours
    last = LastBatchEnd()
    trainer = Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        limit_val_batches=0,
        logger=MLFlowLogger(experiment_name="fit-end", tracking_uri=f"sqlite:///{work}/m.db"),
        callbacks=[callback, last],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(OneMs())
    end_s = time.perf_counter() - last.at
    outside = [
        ns / 1000.0
        for step, ns in enumerate(callback.hook_ns)
        if step >= 10 and action_at(schedule, step) == Action.NONE
    ]
    out: dict[str, object] = {"end_s": end_s, "hook_us": statistics.median(outside)}
    if ours is not None:
        windows = [r for r in Spool(spool).windows() if r.manifest.get("kind") != "rank_metrics"]
        uploading = not windows or any(r.status != "done" for r in windows)
        started = time.perf_counter()
        wait = getattr(ours, "wait", None)  # (a release whose teardown waited has none)
        waited = wait() if wait is not None else None
        after = [r for r in Spool(spool).windows() if r.manifest.get("kind") != "rank_metrics"]
        landed = bool(after) and all(r.status == "done" for r in after)
        out.update(statuses=sorted(r.status for r in after), wait_returned=waited)
        out.update(
            uploading_at_end=uploading,
            wait_s=time.perf_counter() - started,
            landed=landed,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    results: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
    for round_index in range(args.rounds):
        order = VARIANTS[round_index % 2 :] + VARIANTS[: round_index % 2]
        for variant in order:
            with tempfile.TemporaryDirectory() as work:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", variant, work],
                    capture_output=True, text=True, check=True, env=env, cwd=work,
                )  # fmt: skip
                results[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    ends = {v: [float(r["end_s"]) for r in results[v]] for v in VARIANTS}  # type: ignore[arg-type]
    ours = results["neuron-mlflow"]
    extra = [a - b for a, b in zip(ends["neuron-mlflow"], ends["plain callback"], strict=True)]
    print(f"## The end of a fit: {STEPS} steps of 1 ms, {args.rounds} rounds (fresh processes)")
    first, last = WAIT + WARMUP, WAIT + WARMUP + ACTIVE - 1
    print(f"window: steps {first}-{last} (it ends 3 steps before the fit)\n")
    print("| variant | end of fit, median (s) | range (s) |")
    print("|---|---:|---:|")
    for variant in VARIANTS:
        e = ends[variant]
        print(f"| {variant} | {statistics.median(e):.3f} | {min(e):.3f}-{max(e):.3f} |")
    hooks = [float(r["hook_us"]) for r in ours]  # type: ignore[arg-type]
    floor = [float(r["hook_us"]) for r in results["plain callback"]]  # type: ignore[arg-type]
    print(
        f"\nneuron-mlflow's end minus the plain callback's, same round: median "
        f"{statistics.median(extra):.3f} s (range {min(extra):.3f}-{max(extra):.3f}; bar 0.2 s)"
    )
    print(
        f"the callback's three step hooks outside the window: median {statistics.median(hooks):.2f}"
        f" us per step (rounds {min(hooks):.2f}-{max(hooks):.2f}; bar 5 us); the same timing "
        f"around the plain callback's empty hooks: {statistics.median(floor):.2f} us"
    )
    uploading = sum(bool(r["uploading_at_end"]) for r in ours)
    landed = sum(bool(r["landed"]) for r in ours)
    waits = [float(r["wait_s"]) for r in ours]  # type: ignore[arg-type]
    print(
        f"window still uploading when fit returned: {uploading}/{len(ours)} rounds; "
        f"callback.wait() landed it: {landed}/{len(ours)} "
        f"(median wait {statistics.median(waits):.2f} s)"
    )
    for r in ours:
        if not r["landed"]:
            print(f"  not landed: statuses {r['statuses']}, wait() returned {r['wait_returned']}")


if __name__ == "__main__":
    main()
