"""Per step: how long this process's threads waited for a CPU that another process held.

A step on a shared host can take 100x its usual time without running any slower code:
torch's intra-op threads are runnable but wait in the kernel's run queue while another
process holds the core. Measured here (2 vCPUs, a ``while True: pass`` process beside the
RMSNorm main job): of the steps over 3x the window's median, 129 of 146 had a run-queue wait
of at least 5 % of their wall time and 125 of 146 at least one involuntary context switch;
of the steps within 1.5x the median, none had such a wait and 1 of 383 a switch
(``benchmarks/compare_noise.py --probe``). The thread's CPU time against its wall time does
not separate them: OpenMP's waiting threads spin, so CPU time follows wall time.

:class:`InterferenceProbe` reads both at a step's start and end, on the training thread,
inside a window only:

- ``cpu_wait_us``: the summed run-queue wait of the threads that run a step: the training
  thread and the threads Python did not start (torch's intra-op pool) (Linux
  ``/proc/self/task/<tid>/schedstat``, second field; ``None`` elsewhere);
- ``switches``: involuntary context switches of the process (``getrusage``).

A sample costs about 5 us a thread (a ``pread`` of a held-open file), outside the step's
own range in the trace. Which steps count as disturbed is decided later, from these numbers
(:func:`neuron_mlflow.summary.statistics.disturbed`).

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

Sample = tuple[int | None, int]
"""One reading: summed run-queue wait of the process's threads (ns; ``None`` when unknown)
and its involuntary context switches so far."""

_TASKS = "/proc/self/task"


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
        for tid in tids:
            if tid.isdigit() and int(tid) in python:
                continue
            with contextlib.suppress(OSError):
                self._fds.append(os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC))

    def sample(self) -> Sample:
        """The reading now (never raises)."""
        wait: int | None = None
        if self._fds:
            wait = 0
            for fd in self._fds:
                try:
                    wait += int(os.pread(fd, 64, 0).split()[1])
                except (OSError, ValueError, IndexError):
                    continue  # a thread that ended: its wait no longer grows
        try:
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        except OSError:
            switches = 0
        return wait, switches

    def since(self, start: Sample) -> tuple[float | None, int]:
        """``(cpu_wait_us, switches)`` between ``start`` and now."""
        wait, switches = self.sample()
        waited = None if wait is None or start[0] is None else max(wait - start[0], 0) / 1e3
        return waited, max(switches - start[1], 0)

    def close(self) -> None:
        """Close the held files (a window's end)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
