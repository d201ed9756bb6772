"""Benchmark: the window-ending step with a reachable tracking server and without one.

Side by side in one run, interleaved round by round, the time of the decorated call that ends
a profiling window (``nm.profile``, CPU backend, 100 ops x 3 recorded steps per window) when
the tracking server is

- ``http-up``: a real ``mlflow server`` on localhost (the upload happens on the background
  worker; we wait for it between rounds, untimed);
- ``http-hanging``: a stub that accepts connections and never answers;
- ``http-503``: a stub that answers 503 (a proxy in front of a dead server);
- ``http-refused``: nothing listens;

and, as the alternative, a raw ``torch.profiler.profile`` with the same schedule whose
``on_trace_ready`` exports the Chrome trace (what the step that ends a window costs without
neuron-mlflow). Reports medians, the ratio of each server state to ``http-up`` (goal ~1.0:
the step never waits on the network) and of ``http-up`` to the raw profiler. Also counts the
MLflow requests one window costs (from the server's access log).

Run:  .venv/bin/python benchmarks/window_end_network.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import neuron_mlflow as nm  # noqa: E402
from neuron_mlflow.sinks import reachability  # noqa: E402
from tests.conftest import free_port, running_mlflow_server  # noqa: E402
from tests.sinks.stubs import hanging_server, unavailable_server  # noqa: E402

OPS, WARMUP, ACTIVE = 100, 1, 3


def work(x: torch.Tensor) -> torch.Tensor:
    for _ in range(OPS // 2):
        x = torch.relu(x * 1.0001)
    return x


def ours(uri: str, local_dir: str) -> float:
    """Seconds of the call that ends one window (upload not timed: drained after)."""
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    profiled = nm.profile(
        backend="cpu", strict=False, local_dir=local_dir, upload_traces=True,
        schedule=nm.Schedule(warmup=WARMUP, active=ACTIVE),
    )(work)  # fmt: skip
    x = torch.randn(64, 64)
    for _ in range(WARMUP + ACTIVE - 1):
        profiled(x)
    started = time.perf_counter()
    profiled(x)  # ends the window
    elapsed = time.perf_counter() - started
    profiled.profiler.wait(120)  # the worker's upload, untimed
    profiled.profiler.close()
    return elapsed


def raw(trace_dir: str) -> float:
    x = torch.randn(64, 64)

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(Path(trace_dir) / f"trace_{time.monotonic_ns()}.json"))

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(WARMUP + ACTIVE - 1):
            work(x)
            prof.step()
        started = time.perf_counter()  # the step's own work as in `ours`, then the end
        work(x)
        prof.step()  # ends the window: stops and exports
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    times: dict[str, list[float]] = {}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (root / "server").mkdir()
        up = stack.enter_context(running_mlflow_server(root / "server"))
        uris = {
            "http-up": up,
            "http-hanging": stack.enter_context(hanging_server()).uri,
            "http-503": stack.enter_context(unavailable_server()).uri,
            "http-refused": f"http://127.0.0.1:{free_port()}",
        }
        log = root / "server" / "server.log"
        for i in range(args.rounds):
            for name, uri in uris.items():
                reachability.forget()  # every round checks again (the worst case)
                before = log.read_text().count('" 200') if name == "http-up" else 0
                times.setdefault(name, []).append(ours(uri, str(root / f"spool{i}{name}")))
                if name == "http-up":
                    after = log.read_text().count('" 200')
                    times.setdefault("requests", []).append(after - before)
            times.setdefault("torch.profiler", []).append(raw(str(root)))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"window-ending step, median of {args.rounds} rounds ({OPS} ops x {ACTIVE} steps)\n")
    print("| variant | step (ms) | ratio to http-up |")
    print("|---|---:|---:|")
    for name in ("http-up", "http-hanging", "http-503", "http-refused", "torch.profiler"):
        print(f"| {name} | {med[name] * 1e3:.1f} | {med[name] / med['http-up']:.2f} |")
    print(f"\nours (http-up) / raw torch.profiler: {med['http-up'] / med['torch.profiler']:.2f}")
    print(f"MLflow requests per window (server access log, incl. run creation and /health): "
          f"{int(med['requests'])}")  # fmt: skip


if __name__ == "__main__":
    main()
