"""Benchmark: back-to-back windows measure the same work the same.

Windows that follow each other with no gap (``Schedule(warmup=5, active=20, repeat=3)``: window
2's warm-up starts on the step after window 1's last) are captured while the worker process
summarises and uploads the window before. The work does not change between windows, so each
window's ``P/wall_time_us`` (wall time per profiled step) should match the first window's.
Two front ends, each run in its own fresh process (``--runs`` of each, interleaved):

- ``decorator``: ``@nm.profile(schedule=..., backend="cpu")`` on a step of 20 matrix
  multiplies of 64x64 floats, called 75 times;
- ``lightning``: ``nm.NeuronProfilerCallback`` (same schedule, ``logger=False``: it opens its
  own run) on a CPU ``Trainer.fit`` whose ``training_step`` does the same 20 multiplies plus
  a tiny real loss, 75 steps;
- ``raw`` (a control: how much back-to-back windows differ here with no worker at all): a raw
  ``torch.profiler.profile`` with the same schedule around the same step, each window's wall
  time per step from ``perf_counter`` around its active steps (no MLflow).

Each process waits for its run (``prof.run_id`` / ``callback.wait()``), then reads every window's
``P/wall_time_us`` and ``P/cpu_time_us`` back from the run's MLflow metric history (a local
SQLite store in a temp folder, ``MLFLOW_TRACKING_URI``). Reported: window 1's value and every
window's value over window 1's. Target: every window within 1.25x of the first.

The training process runs torch on one intra-op thread by default (``--threads``): on a small
shared host, two OpenMP threads that spin at every multiply's barrier turn any other runnable
process into a stall of the whole step, which is noise that hides what is measured here.

Run:  .venv/bin/python benchmarks/back_to_back.py [--runs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MATMULS, SIZE = 20, 64
WARMUP, ACTIVE, REPEAT = 5, 20, 3
STEPS = (WARMUP + ACTIVE) * REPEAT
EXPERIMENT = "back-to-back-benchmark"
TARGET = 1.25


def work(a, b):
    """One step: ``MATMULS`` multiplies of ``SIZE`` x ``SIZE`` floats."""
    c = a
    for _ in range(MATMULS):
        c = a @ b
    return c


def config(folder: Path) -> dict:
    import neuron_mlflow as nm

    return {
        "schedule": nm.Schedule(warmup=WARMUP, active=ACTIVE, repeat=REPEAT),
        "backend": "cpu",
        "local_dir": str(folder / "spool"),
        "experiment_name": EXPERIMENT,
    }


def history(run_id: str, prefix: str) -> dict[str, list[float]]:
    """Every window's wall and CPU time per step, in window order (by metric step)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    out = {}
    for name in ("wall_time_us", "cpu_time_us"):
        points = client.get_metric_history(run_id, f"{prefix}/{name}")
        out[name] = [p.value for p in sorted(points, key=lambda p: (p.step, p.timestamp))]
    return out


def decorator_child(folder: Path) -> dict:
    import torch

    import neuron_mlflow as nm

    @nm.profile(**config(folder))
    def step(a, b):
        return work(a, b)

    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    for _ in range(STEPS):
        step(a, b)
    run_id = step.profiler.run_id  # waits for the worker's uploads
    assert run_id is not None, "no run: the windows were not uploaded"
    return history(run_id, step.profiler.prefix)


def raw_child(folder: Path) -> dict:
    import torch
    import torch.profiler

    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    windows: list[list[float]] = [[] for _ in range(REPEAT)]
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=REPEAT),
        on_trace_ready=lambda p: p.export_chrome_trace(str(folder / f"raw_{p.step_num}.json")),
    )
    prof.start()
    for index in range(STEPS):
        start = time.perf_counter()
        work(a, b)
        if index % (WARMUP + ACTIVE) >= WARMUP:
            windows[index // (WARMUP + ACTIVE)].append(1e6 * (time.perf_counter() - start))
        prof.step()
    prof.stop()
    wall = [sum(w) / len(w) for w in windows]
    return {"wall_time_us": wall, "cpu_time_us": wall}


def lightning_child(folder: Path) -> dict:
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    import neuron_mlflow as nm

    class MatmulModule(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.a, self.b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)

        def training_step(self, batch, batch_idx):
            c = work(self.a, self.b)
            return self.layer(batch[0]).pow(2).mean() + 0.0 * c[0, 0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = nm.NeuronProfilerCallback(**config(folder))
    trainer = Trainer(
        max_steps=STEPS,
        callbacks=[callback],
        logger=False,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    data = DataLoader(TensorDataset(torch.randn(4 * STEPS, 8)), batch_size=4)
    trainer.fit(MatmulModule(), data)
    callback.wait()  # the worker's uploads (fit returns without waiting for them)
    assert callback.run_id is not None, "no run"
    return history(callback.run_id, callback.prefix("train"))


def run_child(mode: str, base: Path, threads: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=base))
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(folder), str(threads)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mode", choices=["all", "decorator", "lightning", "raw"], default="all")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, folder, threads = args.child
        import torch

        torch.set_num_threads(int(threads))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            child = {"decorator": decorator_child, "lightning": lightning_child}.get(
                mode, raw_child
            )
            print(json.dumps(child(Path(folder))))
        return
    base = Path(tempfile.mkdtemp(prefix="back-to-back-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{base / 'mlflow.db'}"
    from mlflow import MlflowClient

    MlflowClient().create_experiment(EXPERIMENT)  # the store exists before the first run
    modes = ["decorator", "lightning", "raw"] if args.mode == "all" else [args.mode]
    rows: list[tuple[str, int, dict]] = []
    started = time.monotonic()
    for run in range(1, args.runs + 1):
        for mode in modes[run % len(modes) :] + modes[: run % len(modes)]:
            rows.append((mode, run, run_child(mode, base, args.threads)))
        print(f"run {run}/{args.runs} done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    import torch

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, Schedule(warmup={WARMUP}, "
        f"active={ACTIVE}, repeat={REPEAT}), {MATMULS} matmuls of {SIZE}x{SIZE} a step, "
        f"{args.threads} torch thread(s), {args.runs} runs (a fresh process each)"
    )
    print(
        "(raw: the control, perf_counter around each active step of a raw torch.profiler; "
        "its CPU columns repeat the wall time)"
    )
    print()
    print(
        "| front end | run | window 1 wall us/step | wall, windows 2, 3 / window 1 | "
        "window 1 CPU us/step | CPU, windows 2, 3 / window 1 | within 1.25x |"
    )
    print("|---|---:|---:|---|---:|---|---|")
    worst = 0.0
    for mode, run, found in sorted(rows, key=lambda r: (r[0] == "raw", r[0], r[1])):
        wall, cpu = found["wall_time_us"], found["cpu_time_us"]
        if len(wall) != REPEAT:
            sys.exit(f"{mode} run {run}: {len(wall)} windows logged, not {REPEAT}: {wall}")
        wall_ratios = [w / wall[0] for w in wall[1:]]
        cpu_ratios = [c / cpu[0] for c in cpu[1:]]
        if mode != "raw":
            worst = max(worst, *wall_ratios)
        ok = "yes" if max(wall_ratios) <= TARGET else "no"
        print(
            f"| {mode} | {run} | {wall[0]:.0f} | {', '.join(f'{r:.2f}' for r in wall_ratios)} "
            f"| {cpu[0]:.0f} | {', '.join(f'{r:.2f}' for r in cpu_ratios)} | {ok} |"
        )
    print()
    print(f"worst window / window 1 (wall, ours): {worst:.2f} (target <= {TARGET})")
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
