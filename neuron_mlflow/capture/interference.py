"""Per step: how long this process's threads waited for a CPU that another process held.

:class:`InterferenceProbe` reads two counters at a step's start and end, on the training
thread, inside a window only (which, and why: docs/comparing.md, "Disturbed steps");
:func:`neuron_mlflow.summary.statistics.disturbed` judges the steps later.

Example:
    >>> probe = InterferenceProbe()
    >>> probe.open()
    >>> start = probe.sample()
    >>> wait_us, switches = probe.since(start)
    >>> switches >= 0 and (wait_us is None or wait_us >= 0)
    True
    >>> probe.close()
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading

__all__ = ["InterferenceProbe", "Sample"]

Sample = tuple[tuple[int | None, ...], int]
"""One reading: the run-queue wait of each thread read (ns; ``None`` for a thread that
ended) and the process's involuntary context switches so far."""

_TASKS = "/proc/self/task"
MAX_THREADS = 64
"""Threads read at most (the training thread first): a sample's cost stays bounded."""


class InterferenceProbe:
    """Reads the process's run-queue wait and involuntary switches (module docstring)."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def open(self) -> None:
        """Hold the ``schedstat`` file open of the calling (training) thread and of every
        thread that Python did not start (torch's intra-op pool, started by now; not our
        own watcher, MLflow's or a data loader's threads, which do not run the step).
        Never raises."""
        self.close()
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return
        python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        python.discard(threading.get_native_id())
        own = str(threading.get_native_id())
        for tid in sorted(tids, key=lambda t: t != own)[: MAX_THREADS * 4]:
            if len(self._fds) >= MAX_THREADS:
                break
            if tid.isdigit() and int(tid) in python:
                continue
            with contextlib.suppress(OSError):
                self._fds.append(os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC))

    def sample(self) -> Sample:
        """The reading now (never raises)."""
        waits: list[int | None] = []
        for fd in self._fds:
            try:
                waits.append(int(os.pread(fd, 64, 0).split()[1]))
            except (OSError, ValueError, IndexError):
                waits.append(None)  # a thread that ended
        try:
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        except OSError:
            switches = 0
        return tuple(waits), switches

    def since(self, start: Sample) -> tuple[float | None, int]:
        """``(cpu_wait_us, switches)`` between ``start`` and now: the waits of the threads
        read both times (``None`` when none was), summed."""
        waits, switches = self.sample()
        both = [
            end - begin
            for begin, end in zip(start[0], waits, strict=False)
            if begin is not None and end is not None
        ]
        waited = sum(max(d, 0) for d in both) / 1e3 if both else None
        return waited, max(switches - start[1], 0)

    def close(self) -> None:
        """Close the held files (a window's end)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
