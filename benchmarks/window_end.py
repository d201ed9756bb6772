"""Benchmark: the step that ends a profiling window, ours against a raw torch.profiler window.

Side by side in one run, interleaved round by round: the time of the ``step()`` call that
ends a window (torch stops the profiler and exports the trace there) for

- ``neuron-mlflow``: ``nm.profile`` as a context manager (CPU backend, a local MLflow store),
  whose window-ending step stops the profiler, exports the trace into the spool and hands the
  window to the background worker (summary and upload happen there, not timed: we wait for the
  worker between rounds);
- ``torch.profiler``: a raw ``torch.profiler.profile`` with the same schedule and
  ``on_trace_ready`` calling ``export_chrome_trace``,

for a small window (10 ops x 5 steps) and a large one (1000 ops x 20 steps). Reports the
median of the rounds, and the ratio. Goal: at most 1.1 for both.

Run:  .venv/bin/python benchmarks/window_end.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.profiler  # noqa: E402

import neuron_mlflow as nm  # noqa: E402

SIZES = {"small (10 ops x 5 steps)": (10, 5), "large (1000 ops x 20 steps)": (1000, 20)}


def work(ops: int, x: torch.Tensor) -> None:
    """One step: ``ops`` small operators."""
    for _ in range(ops // 2):
        y = x + 1.0
        y.mul_(0.5)


def raw_window_end(ops: int, steps: int, folder: Path) -> float:
    """Seconds of the ``prof.step()`` that ends a raw torch.profiler window."""
    x = torch.ones(8)
    path = folder / "raw.pt.trace.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        )
        prof.start()
        ended = 0.0
        for step in range(steps + 1):
            work(ops, x)
            start = time.perf_counter()
            prof.step()
            if step == steps:
                ended = time.perf_counter() - start
        prof.stop()
    assert path.exists()
    return ended


def our_window_end(ops: int, steps: int, folder: Path) -> float:
    """Seconds of the ``prof.step()`` that ends an ``nm.profile`` window."""
    x = torch.ones(8)
    ended = 0.0
    with nm.profile(
        backend="cpu",
        schedule=nm.Schedule(wait=0, warmup=1, active=steps),
        local_dir=str(folder / "spool"),
        experiment_name="window-end-benchmark",
    ) as prof:
        for step in range(steps + 1):
            work(ops, x)
            start = time.perf_counter()
            prof.step()
            if step == steps:
                ended = time.perf_counter() - start
        prof.session.wait()  # the worker's summary and upload: off the training thread
    assert prof.summary is not None and prof.summary.steps == steps
    return ended


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="window-end-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    rows = []
    for label, (ops, steps) in SIZES.items():
        ours, raw = [], []
        our_window_end(ops, steps, folder)  # warm-up: imports, the store, the worker
        raw_window_end(ops, steps, folder)
        for _ in range(args.rounds):
            ours.append(our_window_end(ops, steps, folder))
            raw.append(raw_window_end(ops, steps, folder))
        rows.append((label, statistics.median(ours), statistics.median(raw)))
    print(f"torch {torch.__version__}, {args.rounds} rounds, medians")
    print("| window | neuron-mlflow ms | torch.profiler ms | ratio |")
    print("|---|---:|---:|---:|")
    for label, ours_s, raw_s in rows:
        print(f"| {label} | {1e3 * ours_s:.1f} | {1e3 * raw_s:.1f} | {ours_s / raw_s:.2f} |")


if __name__ == "__main__":
    main()
