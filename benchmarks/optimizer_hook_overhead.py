"""Benchmark: what ``nm.autolog()``'s optimizer hook costs a plain loop's step outside a window.

Two measurements, in one process, on the CPU:

- the hook itself: ``_on_optimizer_step`` called directly for the clock optimizer, outside a
  window (the schedule's first window far away), timed over many calls (us per step); the
  same loop around an empty function says what the loop costs;
- ``optimizer.step()`` of a tiny SGD (one 16-element parameter) with autolog's hook
  registered and not,
  interleaved in blocks, medians of the per-block mean (us per step): the hook as a loop sees
  it, torch's hook dispatch included.

The bar (#34): at most what the Lightning callback's step hooks cost (about 4 us a step,
``callback_overhead.py``).

Run:  .venv/bin/python benchmarks/optimizer_hook_overhead.py [--calls 200000] [--blocks 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import neuron_mlflow as nm  # noqa: E402
from neuron_mlflow.integrations import autolog as autolog_module  # noqa: E402


def _per_call_us(fn, arg, calls: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        fn(arg, (), {})
    return (time.perf_counter_ns() - started) / calls / 1000.0


def _empty(optimizer, args, kwargs) -> None:
    return None


def _steps_us(optimizer: torch.optim.Optimizer, steps: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter_ns() - started) / steps / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block-steps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.zeros(16))
    param.grad = torch.ones(16)
    optimizer = torch.optim.SGD([param], lr=0.0)
    nm.autolog(
        backend="cpu",
        local_dir=tempfile.mkdtemp(),
        schedule=nm.Schedule(skip_first=10**9),
        poll_s=0,
        capture_signal=None,
    )
    optimizer.step()  # the clock; the loop set up (the run made) outside the timing
    hook_us = _per_call_us(autolog_module._on_optimizer_step, optimizer, args.calls)
    empty_us = _per_call_us(_empty, optimizer, args.calls)
    on, off = [], []
    for block in range(args.blocks):  # interleaved, the order alternating
        for enabled in (block % 2 == 0, block % 2 == 1):
            hook = autolog_module._state.hook
            if enabled and hook is None:
                autolog_module._hook_torch(torch)
            elif not enabled and hook is not None:  # off: no hook registered at all
                hook.remove()
                autolog_module._state.hook = None
            (on if enabled else off).append(_steps_us(optimizer, args.block_steps))
    nm.autolog(disable=True)
    plain = statistics.median(off)
    result = {
        "hook_us_per_step": round(hook_us - empty_us, 3),
        "timing_loop_us_per_call": round(empty_us, 3),
        "optimizer_step_us_plain": round(plain, 3),
        "optimizer_step_us_autolog": round(statistics.median(on), 3),
        "optimizer_step_us_added": round(statistics.median(on) - plain, 3),
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
