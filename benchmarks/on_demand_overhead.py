"""Benchmark: the per-step cost of capture requests (polling) and of the slow-step trigger.

Times the engine calls the front ends make at every step outside a window, in a tight loop:
``StageWindows.begin`` + ``end`` (what the Lightning callback's hooks call) and
``ProfilingSession.begin_step`` + ``end_step`` (what a decorated call adds), with

- ``off``: ``poll_s=0``, no signal, no trigger (no watcher at all);
- ``polling``: ``poll_s=0.05`` with a request file being read by the background thread (the
  training thread checks one flag; the thread's own work competes for the GIL);
- ``trigger``: ``SlowSteps(factor=50)`` (every step is timed and fed to the detector; the
  factor keeps a noisy tight loop from opening real windows);
- ``both``: polling and the trigger.

Each variant runs ``--steps`` steps, ``--rounds`` times interleaved; reported: the median ns
per step, the difference to ``off`` and that difference as a share of a 1 ms step (the bar:
<= 1 %).

Run:  .venv/bin/python benchmarks/on_demand_overhead.py [--steps 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import neuron_mlflow as nm  # noqa: E402
from neuron_mlflow.engine.capture_requests import start_for_stage  # noqa: E402
from neuron_mlflow.engine.session import ProfilingSession  # noqa: E402
from neuron_mlflow.engine.stages import StageWindows  # noqa: E402

VARIANTS = {
    "off": {"poll_s": 0, "capture_signal": None},
    "polling": {"poll_s": 0.05, "capture_signal": None},
    "trigger": {"poll_s": 0, "capture_signal": None, "trigger": nm.SlowSteps(factor=50)},
    "both": {"poll_s": 0.05, "capture_signal": None, "trigger": nm.SlowSteps(factor=50)},
}


def _config(variant: str, local_dir: str) -> nm.ProfilerConfig:
    return nm.ProfilerConfig(
        backend="cpu", local_dir=local_dir, schedule=nm.Schedule(skip_first=10**9),
        **VARIANTS[variant],
    )  # fmt: skip


def stage_ns(variant: str, steps: int) -> float:
    """ns per step of StageWindows.begin + end (the callback's per-step engine calls)."""
    local_dir = tempfile.mkdtemp()
    config = _config(variant, local_dir)
    windows = StageWindows(config, "profile/train", lambda: None)
    windows.watch = start_for_stage(windows, rank=0, world_size=1, run_id=None, tracking_uri=None)
    (Path(local_dir) / "capture").write_text("{}")  # read (once) by the polling thread
    begin, end = windows.begin, windows.end
    started = time.perf_counter_ns()
    for step in range(steps):
        begin(step, "train_step")
        end(step + 1)
    elapsed = time.perf_counter_ns() - started
    if windows.watch is not None:
        windows.watch.close()
    return elapsed / steps


def session_ns(variant: str, steps: int) -> float:
    """ns per step of ProfilingSession.begin_step + end_step (a decorated call's engine calls)."""
    config = _config(variant, tempfile.mkdtemp())
    session = ProfilingSession(config, upload=False)
    begin, end = session.begin_step, session.end_step
    started = time.perf_counter_ns()
    for _ in range(steps):
        begin("f")
        end()
    elapsed = time.perf_counter_ns() - started
    session.close()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            results.setdefault(("callback", variant), []).append(stage_ns(variant, args.steps))
            results.setdefault(("decorator", variant), []).append(session_ns(variant, args.steps))
    print("| front end | variant | ns / step (median) | vs off (ns) | share of a 1 ms step |")
    print("|---|---|---|---|---|")
    for (front, variant), values in results.items():
        median = statistics.median(values)
        off = statistics.median(results[(front, "off")])
        delta = median - off
        print(f"| {front} | {variant} | {median:.0f} | {delta:+.0f} | {delta / 1e6 * 100:.3f} % |")


if __name__ == "__main__":
    main()
