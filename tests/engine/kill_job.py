"""A decorated loop that is killed right after its window ends; run by test_worker.py.

Usage: python tests/engine/kill_job.py LOCAL_DIR

It prints ``ENDED`` as soon as the call that ends the window has returned (the window is in
the spool and queued for the worker process), then waits to be killed (SIGKILL).
"""

from __future__ import annotations

import sys
import time

import neuron_mlflow as nm
from tests.helpers import inputs, rmsnorm_naive


def main(local_dir: str) -> None:
    profiled = nm.profile(
        backend="cpu", local_dir=local_dir, schedule=nm.Schedule(warmup=1, active=3)
    )(rmsnorm_naive)
    x, w = inputs()
    for _ in range(4):
        profiled(x, w)
    print("ENDED", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
