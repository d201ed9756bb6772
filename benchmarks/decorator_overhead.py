"""Benchmark: the decorator's cost outside its window, and MLflow requests per window.

1. Per-call overhead of a decorated function outside its profiling window (before the window
   and after it finished) against the same undecorated function, measured side by side in one
   run, interleaved, best of several rounds. Target: under 5 us per call.
2. The number of HTTP requests made to a real local ``mlflow server`` to log one window of
   500 distinct ops (``top_k=500``). On the CPU backend that is 1004 metrics (two per op plus
   four totals); a device backend logs four per op plus five totals, 2005, which the same
   batching sends in three requests. Target: at most 3 requests for the window's metrics.

Run:  .venv/bin/python benchmarks/decorator_overhead.py
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import neuron_mlflow as nm  # noqa: E402

CALLS = 200_000
ROUNDS = 5


def plain(x: int) -> int:
    return x


def per_call_ns(fn, calls: int = CALLS) -> float:
    start = time.perf_counter_ns()
    for i in range(calls):
        fn(i)
    return (time.perf_counter_ns() - start) / calls


def overhead(local_dir: str) -> dict[str, float]:
    before = nm.profile(
        backend="cpu", local_dir=local_dir, schedule=nm.Schedule(wait=10**9, active=1)
    )(plain)
    after = nm.profile(
        backend="cpu", local_dir=local_dir, schedule=nm.Schedule(warmup=0, active=1)
    )(plain)
    after(0)  # runs (and logs) its only window; every later call is after the window
    best = collections.defaultdict(lambda: float("inf"))
    for _ in range(ROUNDS):
        for name, fn in (("plain", plain), ("before window", before), ("after window", after)):
            best[name] = min(best[name], per_call_ns(fn))
    return dict(best)


def requests_for_500_ops(local_dir: str) -> tuple[collections.Counter, list[int]]:
    """HTTP requests (by endpoint) to log one window of 500 ops, and metrics per request."""
    import mlflow.utils.rest_utils as rest_utils
    from torch.profiler import record_function

    from tests.conftest import running_mlflow_server  # the same real server the tests use

    counts: collections.Counter = collections.Counter()
    metrics_per_request: list[int] = []
    original = rest_utils.http_request

    def counting(host_creds, endpoint, method, *args, **kwargs):
        counts[f"{method} {endpoint}"] += 1
        payload = kwargs.get("json") or {}
        if payload.get("metrics"):
            metrics_per_request.append(len(payload["metrics"]))
        return original(host_creds, endpoint, method, *args, **kwargs)

    def five_hundred_ops() -> None:
        for i in range(500):
            with record_function(f"op_{i:03d}"):
                pass

    with running_mlflow_server(Path(tempfile.mkdtemp())) as uri:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        profiled = nm.profile(
            backend="cpu", top_k=500, local_dir=local_dir, schedule=nm.Schedule(warmup=0, active=1)
        )(five_hundred_ops)
        rest_utils.http_request = counting  # counts, then forwards every request unchanged
        try:
            profiled()
        finally:
            rest_utils.http_request = original
    return counts, metrics_per_request


def main() -> None:
    local_dir = tempfile.mkdtemp()
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{local_dir}/bench.db")
    result = overhead(local_dir)
    base = result["plain"]
    print("## Per-call cost outside the window (best of 5 rounds of 200,000 calls)\n")
    print("| function | ns per call | overhead vs plain (us) | ratio |")
    print("|---|---:|---:|---:|")
    for name, ns in result.items():
        print(f"| {name} | {ns:.0f} | {(ns - base) / 1000:.2f} | {ns / base:.1f}x |")
    counts, metric_requests = requests_for_500_ops(local_dir)
    print("\n## MLflow HTTP requests to log one 500-op window (CPU backend)\n")
    print("| request | count |")
    print("|---|---:|")
    for key, n in sorted(counts.items()):
        print(f"| {key} | {n} |")
    print(
        f"\nrequests carrying metrics: {len(metric_requests)} "
        f"(metrics per request: {metric_requests}; at most 1000 each)"
    )


if __name__ == "__main__":
    main()
