"""Benchmark: what each front end's per-step hooks cost outside a window, side by side (#34).

Three front ends, each in its own framework's real loop on the CPU, with no profiling and with
ours, in one invocation:

- ``lightning``: a Lightning ``Trainer`` fitting ``BoringModel``; the hooks timed are the
  callback's three step hooks (``on_train_batch_start``, ``on_before_optimizer_step``,
  ``on_train_batch_end``): ``NeuronProfilerCallback``'s, or an empty ``Callback``'s;
- ``hf``: a Hugging Face ``Trainer`` on the same model as a ``torch.nn.Module``; the hooks timed
  are the callback's two step hooks (``on_step_begin``, ``on_step_end``): ``HfProfilerCallback``'s,
  or an empty ``TrainerCallback``'s;
- ``autolog``: a plain PyTorch loop with the same step; the hook timed is
  the global optimizer step hook: ``nm.autolog()``'s, or an empty hook registered the same way.

Every loop runs the same step (``BoringModel``'s: a 32 -> 2 linear layer, a batch of 2, SGD),
so that the work around the hooks, which decides how warm the caches are when they run, is the
same. "no profiling" times the framework's empty hooks the same way: what the timing itself
costs (the floor); "ours - empty" is the cost of our code. "back to back": the same hooks
replayed at step 100 with the arguments the loop gave them, 5 blocks of 4,000 in a row, the
fastest block (warm caches, no timer inside): our code's cost alone. The schedule opens no
window in the run (``wait`` past the last step), so every step is outside a window, with the
capture-request poller running as in a job. Each (front end, variant) runs in a fresh Python
process, the order rotated over rounds; reported are medians over the rounds of each process's
median per step (the first 20 steps left out), and the step time (one step hook to the next)
with and without our hooks.

Run:  .venv/bin/python benchmarks/hooks_cost.py [--rounds 3] [--steps 400]
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

SKIP = 20  # start-up steps left out
FRONT_ENDS = ("lightning", "hf", "autolog")
VARIANTS = ("no profiling", "ours")


DIRECT_AT, DIRECT_CALLS = 100, 20_000


class Timing:
    """Time spent in one step's timed hooks (ns), and the time between step beginnings.

    ``direct_us``: the same hooks called back to back ``DIRECT_CALLS`` times with the
    arguments the loop gave them, at step ``DIRECT_AT`` (warm caches, no timer in the loop).
    """

    def __init__(self, hooks: int) -> None:
        self.hooks = hooks  # the timed hooks of one step
        self.hook_us: list[float] = []
        self.step_us: list[float] = []
        self.direct_us: float | None = None
        self.calls: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
        self._pending = 0
        self._begun = 0

    def note(self, name: str, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A hook's call, to replay; at step ``DIRECT_AT`` the step's hooks are replayed."""
        self.calls[name] = (method, args, kwargs)
        if (
            len(self.step_us) == DIRECT_AT
            and self.direct_us is None
            and len(self.calls) == self.hooks
        ):
            sequence = list(self.calls.values())
            blocks = []  # the least disturbed of 5 blocks (as timeit's best of repeats)
            for _ in range(5):
                t0 = time.perf_counter_ns()
                for _ in range(DIRECT_CALLS // 5):
                    for fn, a, k in sequence:
                        fn(*a, **k)
                blocks.append((time.perf_counter_ns() - t0) / 1000.0 / (DIRECT_CALLS // 5))
            self.direct_us = min(blocks)

    def begin(self, t0: int, t1: int) -> None:
        if self._begun:
            self.step_us.append((t0 - self._begun) / 1000.0)
        self._begun = t0
        self._pending = t1 - t0

    def add(self, t0: int, t1: int) -> None:
        self._pending += t1 - t0

    def end(self, t0: int, t1: int) -> None:
        self.hook_us.append((self._pending + t1 - t0) / 1000.0)


def _config(spool: str) -> dict[str, Any]:
    import neuron_mlflow as nm

    # no window in the run: every step is outside one (the poller runs, as in a job)
    return {"schedule": nm.Schedule(wait=10**7, warmup=1, active=1), "backend": "cpu",
            "local_dir": spool}  # fmt: skip


def run_lightning(variant: str, steps: int, spool: str) -> Timing:
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    import neuron_mlflow as nm

    timing = Timing(3)
    base: type = nm.NeuronProfilerCallback if variant == "ours" else Callback

    class Timed(base):  # type: ignore[misc, valid-type]
        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            timing.note("on_train_batch_start", super().on_train_batch_start, args, kwargs)
            t0 = time.perf_counter_ns()
            super().on_train_batch_start(*args, **kwargs)
            timing.begin(t0, time.perf_counter_ns())

        def on_before_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            timing.note("on_before_optimizer_step", super().on_before_optimizer_step, args, kwargs)
            t0 = time.perf_counter_ns()
            super().on_before_optimizer_step(*args, **kwargs)
            timing.add(t0, time.perf_counter_ns())

        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            timing.note("on_train_batch_end", super().on_train_batch_end, args, kwargs)
            t0 = time.perf_counter_ns()
            super().on_train_batch_end(*args, **kwargs)
            timing.end(t0, time.perf_counter_ns())

    callback = Timed(**_config(spool)) if variant == "ours" else Timed()
    trainer = Trainer(accelerator="cpu", max_steps=steps, limit_val_batches=0, logger=False,
                      callbacks=[callback], enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(BoringModel())
    return timing


def _Boring() -> Any:
    """Lightning's ``BoringModel`` as a Hugging Face model: the same layer, loss and step."""
    import torch

    class Boring(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 2)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            out = self.layer(x)
            return {"loss": torch.nn.functional.mse_loss(out, torch.ones_like(out))}

    return Boring()


def run_hf(variant: str, steps: int, spool: str) -> Timing:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import neuron_mlflow as nm

    timing = Timing(2)
    base: type = nm.HfProfilerCallback if variant == "ours" else TrainerCallback

    class Timed(base):  # type: ignore[misc, valid-type]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            timing.note("on_step_begin", super().on_step_begin, args, kwargs)
            t0 = time.perf_counter_ns()
            super().on_step_begin(*args, **kwargs)
            timing.begin(t0, time.perf_counter_ns())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            timing.note("on_step_end", super().on_step_end, args, kwargs)
            t0 = time.perf_counter_ns()
            super().on_step_end(*args, **kwargs)
            timing.end(t0, time.perf_counter_ns())

    callback = Timed(**_config(spool)) if variant == "ours" else Timed()
    torch.manual_seed(0)
    data = [{"x": x, "labels": torch.zeros(2)} for x in torch.randn(64, 32)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, use_cpu=True,
                             per_device_train_batch_size=2, optim="sgd", learning_rate=0.1,
                             max_grad_norm=0.0, logging_steps=10**6, save_strategy="no",
                             report_to=[], disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=_Boring(), args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    return timing


def run_autolog(variant: str, steps: int, spool: str) -> Timing:
    import torch
    from torch.optim import optimizer as torch_optimizer

    import neuron_mlflow as nm

    timing = Timing(1)
    if variant == "ours":
        nm.autolog(**_config(spool))
    else:
        torch_optimizer.register_optimizer_step_post_hook(lambda opt, args, kwargs: None)
    hooks = torch_optimizer._global_optimizer_post_hooks
    assert len(hooks) == 1, "one global optimizer step hook: the one timed"
    (key,) = hooks
    hook = hooks[key]

    def timed(opt: Any, args: Any, kwargs: Any) -> None:
        timing.note("hook", hook, (opt, args, kwargs), {})
        t0 = time.perf_counter_ns()
        hook(opt, args, kwargs)
        t1 = time.perf_counter_ns()
        timing.begin(t0, t1)  # the hook ends one step and begins the next
        timing.end(t1, t1)

    hooks[key] = timed
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 2)  # BoringModel's step: a batch of 2, MSE against ones, SGD
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(64, 2, 32)
    for step in range(steps):
        optimizer.zero_grad()
        out = model(batches[step % 64])
        torch.nn.functional.mse_loss(out, torch.ones_like(out)).backward()
        optimizer.step()
    if variant == "ours":
        nm.autolog(disable=True)
    return timing


RUNNERS = {"lightning": run_lightning, "hf": run_hf, "autolog": run_autolog}
HOOKS = {
    "lightning": "on_train_batch_start + on_before_optimizer_step + on_train_batch_end",
    "hf": "on_step_begin + on_step_end",
    "autolog": "the global optimizer step hook",
}
NAMES = {"lightning": "Lightning callback", "hf": "HF callback", "autolog": "autolog hook"}


def _available() -> list[str]:
    import importlib.util

    found = []
    for front in FRONT_ENDS:
        module = {"lightning": "lightning", "hf": "transformers", "autolog": None}[front]
        if front == "autolog":
            ok = (ROOT / "neuron_mlflow" / "integrations" / "autolog.py").exists()
        else:
            ok = importlib.util.find_spec(module) is not None  # type: ignore[arg-type]
        if ok:
            found.append(front)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--front-ends", default=",".join(FRONT_ENDS))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(1)  # less scheduler noise on small machines
        spool = tempfile.mkdtemp()
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{spool}/bench.db")
        front, variant = args.worker
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            timing = RUNNERS[front](variant, args.steps, spool)
        print(json.dumps({"hook_us": timing.hook_us, "step_us": timing.step_us,
                          "direct_us": timing.direct_us}))  # fmt: skip
        return
    fronts = [f for f in args.front_ends.split(",") if f in _available()]
    jobs = [(f, v) for f in fronts for v in VARIANTS]
    hook: dict[tuple[str, str], list[float]] = {}
    step: dict[tuple[str, str], list[float]] = {}
    direct: dict[tuple[str, str], list[float]] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    for round_index in range(args.rounds):
        shift = round_index % len(jobs)
        for front, variant in jobs[shift:] + jobs[:shift]:
            command = [sys.executable, __file__, "--worker", front, variant]
            result = subprocess.run([*command, "--steps", str(args.steps)], capture_output=True,
                                    text=True, env=env, check=False)  # fmt: skip
            if result.returncode != 0:
                sys.exit(f"{front} / {variant} failed:\n{result.stderr[-3000:]}")
            data = json.loads(result.stdout.strip().splitlines()[-1])
            hook.setdefault((front, variant), []).append(statistics.median(data["hook_us"][SKIP:]))
            step.setdefault((front, variant), []).append(statistics.median(data["step_us"][SKIP:]))
            direct.setdefault((front, variant), []).append(data["direct_us"])
            print(f"  round {round_index + 1}: {front} / {variant} done", file=sys.stderr)

    def med(values: dict[tuple[str, str], list[float]], key: tuple[str, str]) -> float:
        return statistics.median(values[key])

    print(f"## Per-step hooks outside a window ({args.rounds} rounds x {args.steps} steps, "
          f"one process each; medians over the rounds, us per step)\n")  # fmt: skip
    print(
        "| front end | hooks | in the loop: no profiling (empty hooks) | in the loop: ours "
        "| ours - empty | back to back: empty | back to back: ours | ours - empty "
        "| vs Lightning's (back to back) | step: no profiling | step: ours |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    net = {
        front: med(direct, (front, "ours")) - med(direct, (front, "no profiling"))
        for front in fronts
    }
    for front in fronts:
        floor, ours = med(hook, (front, "no profiling")), med(hook, (front, "ours"))
        d_floor, d_ours = med(direct, (front, "no profiling")), med(direct, (front, "ours"))
        plain, with_ours = med(step, (front, "no profiling")), med(step, (front, "ours"))
        versus = f"{net[front] / net['lightning']:.2f}" if "lightning" in net else "-"
        print(f"| {NAMES[front]} | {HOOKS[front]} | {floor:.2f} | {ours:.2f} | {ours - floor:.2f} "
              f"| {d_floor:.2f} | {d_ours:.2f} | {net[front]:.2f} | {versus} | {plain:.0f} "
              f"| {with_ours:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
