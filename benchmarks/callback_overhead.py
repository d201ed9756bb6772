"""Benchmark: step time of a tiny Lightning model with no profiler, NeuronProfilerCallback
(outside and inside its window) and Lightning's own PyTorchProfiler with the same schedule.

All variants run side by side in one invocation, interleaved over several rounds (rotating
the order), each run in a fresh Python process (step times drift within a long-lived process
even with no profiler at all), on the same model and data. Per-step times are taken from the
first ``on_train_batch_start`` hook to the last ``on_train_batch_end`` hook, so every
callback's hook cost is inside the step. Reported are medians and ratios against no
profiler, and the time spent inside the callback's own three step hooks
(``on_train_batch_start``, ``on_before_optimizer_step``, ``on_train_batch_end``) outside its
window, measured directly (the bar: at most 5 us per step together), and the same timing
around an empty callback's hooks (in the no-profiler variant: what the timing itself costs).

Run:  .venv/bin/python benchmarks/callback_overhead.py [--rounds 6] [--steps 400]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402
from lightning.pytorch.loggers import MLFlowLogger  # noqa: E402
from lightning.pytorch.profilers import PyTorchProfiler  # noqa: E402

import neuron_mlflow as nm  # noqa: E402
from neuron_mlflow.schedule import Action, action_at  # noqa: E402

WAIT, WARMUP, ACTIVE = 200, 2, 20


class StepStart(Callback):
    def __init__(self) -> None:
        self.started = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.started = time.perf_counter_ns()


class StepEnd(Callback):
    def __init__(self, start: StepStart) -> None:
        self.start = start
        self.durations: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.durations.append((time.perf_counter_ns() - self.start.started) / 1000.0)


class TimedHooks:
    """Records the time spent in the three per-step hooks (batch start, before the optimizer
    step, batch end) of the callback class it is mixed into, in us per step."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hook_us: list[float] = []
        self._pending = 0

    def on_train_batch_start(self, *args, **kwargs) -> None:
        t0 = time.perf_counter_ns()
        super().on_train_batch_start(*args, **kwargs)
        self._pending = time.perf_counter_ns() - t0

    def on_before_optimizer_step(self, *args, **kwargs) -> None:
        t0 = time.perf_counter_ns()
        super().on_before_optimizer_step(*args, **kwargs)
        self._pending += time.perf_counter_ns() - t0

    def on_train_batch_end(self, *args, **kwargs) -> None:
        t0 = time.perf_counter_ns()
        super().on_train_batch_end(*args, **kwargs)
        self.hook_us.append((self._pending + time.perf_counter_ns() - t0) / 1000.0)


class TimedCallback(TimedHooks, nm.NeuronProfilerCallback):
    """NeuronProfilerCallback, its step hooks timed."""


class TimedEmpty(TimedHooks, Callback):
    """Lightning's empty hooks timed the same way: what the timing itself costs (the floor)."""


HOOK_US: list[float] = []


def run(variant: str, steps: int, spool: str) -> list[float]:
    start = StepStart()
    end = StepEnd(start)
    callbacks: list[Callback] = [start]
    profiler = None
    timed = None
    if variant == "neuron-mlflow":
        timed = TimedCallback(
            schedule=nm.Schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
            backend="cpu",
            local_dir=spool,
        )
        callbacks.append(timed)
    elif variant == "no profiler":
        timed = TimedEmpty()  # (about 1 us a step: the no-profiler baseline barely moves)
        callbacks.append(timed)
    elif variant == "PyTorchProfiler":
        profiler = PyTorchProfiler(
            dirpath=spool,
            filename="lightning",
            schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
        )
    callbacks.append(end)
    torch.manual_seed(0)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        # the same MLflow logger in every variant: importing MLflow and opening its store
        # changes step times by itself, and the callback is meant to run beside it
        logger=MLFlowLogger(
            experiment_name="bench", tracking_uri=os.environ["MLFLOW_TRACKING_URI"]
        ),
        callbacks=callbacks,
        profiler=profiler,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(BoringModel())
    if timed is not None:
        HOOK_US[:] = timed.hook_us
    return end.durations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # less scheduler noise on small machines
    spool = tempfile.mkdtemp()
    if args.worker:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{spool}/bench.db")
        durations = run(args.worker, args.steps, spool)
        print(json.dumps({"durations": durations, "hook_us": HOOK_US}))
        return
    schedule = nm.Schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
    variants = ["no profiler", "neuron-mlflow", "PyTorchProfiler"]
    ratios: dict[str, list[float]] = {}
    medians: dict[str, list[float]] = {}
    hook_medians: list[float] = []
    floor_medians: list[float] = []
    for round_index in range(args.rounds):
        order = variants[round_index % 3 :] + variants[: round_index % 3]  # rotate the order
        buckets: dict[str, list[float]] = {}
        for variant in order:
            result = json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--worker", variant, "--steps", str(args.steps)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            durations = result["durations"]
            outside = [
                us
                for step, us in enumerate(result["hook_us"])
                if step >= 10 and action_at(schedule, step) == Action.NONE
            ]
            if outside:
                medians_of = hook_medians if variant == "neuron-mlflow" else floor_medians
                medians_of.append(statistics.median(outside))
            for step, us in enumerate(durations):
                action = action_at(schedule, step)
                if step < 10 or action in (Action.WARMUP, Action.RECORD_AND_SAVE):
                    continue  # start-up, warm-up and the window's last (summary/upload) step
                where = "outside window" if action == Action.NONE else "inside window"
                buckets.setdefault(f"{variant} | {where}", []).append(us)
        base = statistics.median(buckets["no profiler | outside window"])
        for key, values in buckets.items():
            medians.setdefault(key, []).append(statistics.median(values))
            ratios.setdefault(key, []).append(statistics.median(values) / base)
    print(f"## Step time, tiny Lightning model on CPU ({args.rounds} rounds x {args.steps} steps)")
    print(f"schedule: wait={WAIT}, warmup={WARMUP}, active={ACTIVE}; ratio = median over rounds")
    print("of (variant's median step / no profiler's median step, same round)\n")
    print("| variant | where | median step (us) | ratio vs no profiler | ratio range |")
    print("|---|---|---:|---:|---:|")
    for key in sorted(ratios):
        variant, where = key.split(" | ")
        r = ratios[key]
        print(
            f"| {variant} | {where} | {statistics.median(medians[key]):.0f} "
            f"| {statistics.median(r):.3f} | {min(r):.3f}-{max(r):.3f} |"
        )
    base = statistics.median(medians["no profiler | outside window"])
    hooks = statistics.median(hook_medians)
    floor = statistics.median(floor_medians)
    print(
        f"\nTime inside NeuronProfilerCallback's three per-step hooks outside the window (measured "
        f"directly): median {hooks:.1f} us per step (rounds {min(hook_medians):.1f}-"
        f"{max(hook_medians):.1f}; bar 5 us) = {100 * hooks / base:.2f}% of the no-profiler "
        f"median step ({base:.0f} us). The same timing around Lightning's empty hooks (what "
        f"the timing itself costs): {floor:.1f} us."
    )


if __name__ == "__main__":
    main()
