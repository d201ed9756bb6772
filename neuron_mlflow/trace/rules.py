"""What counts in a window: the one set of rules every summary follows (live, ``summarize``,
``ingest``, ``compare``), and the marked ranges they use.

=====================================  ==========================================================
event                                  counts as
=====================================  ==========================================================
``ProfilerStep#N`` (step marker)       not an operator; one profiled step (its ``user_annotation``)
``neuron_mlflow: <name>`` (marker)     not an operator; a *marked range*: each decorated call and
                                       each Lightning training step (``neuron_mlflow: train_step``)
runtime API call (``cuda_runtime``,    not an operator; links its device events to the innermost
``cuda_driver``, ``*_runtime``)        operator around it (``args.correlation``)
CPU operator (``cpu_op``, other        an operator. When the trace holds marked ranges, only
``user_annotation`` ranges)            those inside one: nested in a marker on its own thread, or
                                       in a call tree (another thread's: autograd, ...) whose
                                       root starts inside a marked range of the same process
only child of the same name            folded into its parent, as torch's own tables do
(``aten::div_`` in ``aten::div_``)     (``key_averages()``: one call, the same self time)
top-level call                         an operator with no parent but markers (a root, when the
                                       trace holds no marked ranges)
device event (``kernel``,              its time counts once, to the operator whose runtime call
``gpu_memcpy``, ``gpu_memset``, ...)   launched it, and only if that operator counts; with marked
                                       ranges, device events launched outside them are left out
                                       (also of the device total and the kernel table)
steps and wall time                    steps: the outermost marked ranges, else the ``ProfilerStep``
                                       ranges (no more than the live window recorded: trace
                                       metadata), else 1; wall: the time of those ranges, else
                                       the operators' span
peak memory (``[memory]`` events)      the highest ``Total Allocated`` per device, inside the
                                       marked ranges when there are any
FLOPs (``with_flops``)                 estimated from each counted operator's input shapes, with
                                       torch's own formulas (:mod:`neuron_mlflow.trace.shapes`)
=====================================  ==========================================================

Marker names are built in :mod:`neuron_mlflow.naming`.

Example:
    >>> marks = Marks()
    >>> marks.add(1, 10.0, 20.0); marks.add(1, 15.0, 30.0)
    >>> marks.covers(1, 25.0), marks.covers(1, 31.0), marks.covers(2, 25.0)
    (True, False, False)
"""

from __future__ import annotations

import bisect
from typing import Any


class Marks:
    """The marked ranges of a trace, per process, as a union of disjoint intervals."""

    def __init__(self) -> None:
        self._by_pid: dict[Any, tuple[list[float], list[float]]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_pid)

    def add(self, pid: Any, start: float, end: float) -> None:
        """Add the range ``[start, end]`` of process ``pid``, merged with those it overlaps."""
        starts, ends = self._by_pid.setdefault(pid, ([], []))
        lo = bisect.bisect_left(ends, start)  # first interval ending at or after start
        hi = bisect.bisect_right(starts, end)  # intervals from lo to hi overlap
        if lo < hi:
            start, end = min(start, starts[lo]), max(end, ends[hi - 1])
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def covers(self, pid: Any, t: float) -> bool:
        """True when ``t`` lies inside a marked range of process ``pid``."""
        spans = self._by_pid.get(pid)
        if spans is None:
            return False
        i = bisect.bisect_right(spans[0], t) - 1
        return i >= 0 and t <= spans[1][i]
