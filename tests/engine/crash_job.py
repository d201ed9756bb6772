"""A decorated loop whose process dies after its windows are spooled, before any summary.

Usage: python tests/engine/crash_job.py LOCAL_DIR WINDOWS [BACKEND]

BACKEND is ``cpu`` (default) or ``neuron`` (with ``tests/neuron_double`` on ``PYTHONPATH``).

The background worker is kept busy (one long job queued first), so each window that ends is
in the spool (manifest + trace, ``"summarised": false``) but never summarised; then the
process ends with ``os._exit`` (no atexit drain), as a crash or a kill would. With
``CRASH_JOB_HOLD=1`` it prints ``SPOOLED`` and stays alive (its windows still its own) until
killed.
"""

from __future__ import annotations

import os
import sys
import threading

import torch

import neuron_mlflow as nm
from neuron_mlflow.engine.worker import worker
from tests.helpers import inputs, rmsnorm_naive


def main(local_dir: str, windows: int, backend: str = "cpu") -> None:
    release = threading.Event()
    worker().submit(release.wait, 600)  # the worker is busy until the process dies
    profiled = nm.profile(
        backend=backend,
        strict=True,
        local_dir=local_dir,
        schedule=nm.Schedule(warmup=1, active=2, repeat=windows),
        top_k=1000,
    )(rmsnorm_naive)
    x, w = inputs()
    for _ in range(3 * windows):
        torch.zeros(3) + 1  # work between calls: left out
        profiled(x, w)
    if os.environ.get("CRASH_JOB_HOLD") == "1":  # alive, windows held, until killed
        print("SPOOLED", flush=True)
        sys.stdin.read()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
