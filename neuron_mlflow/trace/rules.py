"""What counts in a window: the one set of rules every summary follows (live, ``summarize``,
``ingest``, ``compare``), and the marked ranges they use.

The table of what each event counts as is in ``docs/metrics.md`` ("What counts in a window");
marker names are built in :mod:`neuron_mlflow.naming`.

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
