"""A decorated loop whose process dies after its windows are spooled, before any summary.

Usage: python tests/engine/crash_job.py LOCAL_DIR WINDOWS [BACKEND]

BACKEND is ``cpu`` (default) or ``neuron`` (with ``tests/neuron_double`` on ``PYTHONPATH``).

The spool's worker process is kept from running (this process holds the worker lock, as a
busy worker would), so each window that ends stays staged in the spool (its trace staged,
its record queued), never put in place nor summarised; then the
process ends with
``os._exit`` (no atexit wait), as a crash or a kill would. With
``CRASH_JOB_HOLD=1`` it prints ``SPOOLED`` and stays alive (its windows still its own) until
killed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import neuron_mlflow as nm
from neuron_mlflow.sinks.claims import WORKER_LOCK, claim_file
from tests.helpers import inputs, rmsnorm_naive


def main(local_dir: str, windows: int, backend: str = "cpu") -> None:
    Path(local_dir).mkdir(parents=True, exist_ok=True)
    busy = claim_file(Path(local_dir) / WORKER_LOCK)  # no worker serves the queue until we die
    assert busy is not None
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
