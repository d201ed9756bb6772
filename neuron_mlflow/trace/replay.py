"""One thread's operators, logged and replayed in step with its runtime calls.

Used by both trace passes (:mod:`neuron_mlflow.trace.streaming`,
:mod:`neuron_mlflow.trace.buffered`): the call tree, self and total times, top-level calls,
what counts inside marked ranges (:mod:`neuron_mlflow.trace.rules`) and which operator each
runtime call was made in.

Example:
    >>> from neuron_mlflow.trace.links import Links, Spill
    >>> totals = Totals()
    >>> thread = Thread(totals, Spill(), pid=1)
    >>> for start, dur, name in [(0.0, 10.0, "outer"), (2.0, 3.0, "inner")]:
    ...     thread.starts.append(start); thread.durs.append(dur)
    ...     thread.names.append(totals.name_id(name))
    >>> thread.pending.append((3.0, 7))  # a runtime call inside "inner"
    >>> links = Links(totals, Spill())
    >>> thread.place_pending(links, final=True)
    >>> totals.self_cpu, links.current
    ([7.0, 3.0], {7: 2})
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections import deque
from collections.abc import Iterator
from typing import Any

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.naming import CALL_MARKER_PREFIX
from neuron_mlflow.trace.links import IN_MARKER, Links, Spill
from neuron_mlflow.trace.totals import STEP_MARKER, Totals

BLOCK_OPS = 1 << 15  # logged operators per thread kept in memory before they spill
LAUNCH_WINDOW = 1 << 12  # runtime calls per thread held back to be placed in time order
MARKERS = (STEP_MARKER, CALL_MARKER_PREFIX)
NOT_COUNTED, COUNTED, MARKER = 0, 1, 2  # an open operator's state in the marked view


class Thread:
    """One thread's operator log, replayed in step with its runtime calls.

    Operators are logged as they arrive (start, duration, name id: 24 bytes each) and
    replayed (call tree, totals, placing runtime calls) only as far as the thread's
    runtime calls need, or at the end: a runtime call may be written long after the
    operators around it. The unreplayed log spills to disk in blocks of ``BLOCK_OPS``.
    The replay stack holds ``(end, name id, state)`` of the open operators.
    """

    __slots__ = (
        "blocks",
        "candidates",
        "check_at",
        "durs",
        "head",
        "last_dur",
        "last_start",
        "marked",
        "names",
        "peek",
        "pending",
        "pid",
        "placed_until",
        "prev",
        "replayed_to",
        "spill",
        "stack",
        "starts",
        "totals",
    )

    def __init__(self, totals: Totals, spill: Spill, pid: Any = None) -> None:
        self.totals = totals
        self.spill = spill
        self.pid = pid
        self.marked = bool(totals.marks)  # keep the marked view (set when a marker is read)
        self.last_start = -math.inf
        self.last_dur = 0.0
        self.pending: list[tuple[float, int]] = []  # (ts, correlation) of runtime calls
        self.check_at = 2 * LAUNCH_WINDOW  # place the waiting calls when this many wait
        self.starts, self.durs, self.names = array("d"), array("d"), array("q")  # log tail
        self.blocks: deque[tuple[int, int, int]] = deque()  # (offset, length, operators)
        self.head: Iterator[tuple[float, float, int]] = iter(())
        self.peek: tuple[float, float, int] | None = None
        self.stack: list[tuple[float, int, int]] = []  # (end, name id, state), open ops
        self.placed_until = -math.inf
        self.replayed_to = -math.inf
        # torch's own tables fold an operator's only child of the same name into it
        # (``EventList._remove_dup_nodes``: aten::div_ -> aten::div_); so do we. A first
        # child of the same name waits here, under its parent's entry, until the parent
        # ends (folded) or has a second child (kept).
        self.candidates: dict[int, tuple[int, float, int]] = {}
        self.prev: tuple[float, int, int] | None = None  # the entry replayed last

    def _fold(self, entry: tuple[float, int, int]) -> None:
        """``entry`` ends: fold its only child of the same name, if it waits."""
        child = self.candidates.pop(id(entry), None)
        if child is not None:
            index, dur, state = child
            totals = self.totals
            totals.count[index] -= 1
            totals.total_cpu[index] -= dur
            if state == COUNTED:
                totals.m_count[index] -= 1
                totals.m_total_cpu[index] -= dur

    def _child(self, parent: tuple[float, int, int], index: int) -> bool:
        """A new operator ``index`` under ``parent``: True if it may be folded into it."""
        candidates = self.candidates
        if candidates and id(parent) in candidates:  # a second child: keep the first
            del candidates[id(parent)]
            return False
        names = self.totals.names
        return parent is self.prev and parent[1] >= 0 and names[parent[1]] == names[index]

    def end_all(self) -> None:
        """Close the operators still open at the end of the trace."""
        while self.stack:
            self._fold(self.stack.pop())

    def spill_tail(self) -> None:
        """Move the log's tail to the spill file (called when it reaches ``BLOCK_OPS``)."""
        data = self.starts.tobytes() + self.durs.tobytes() + self.names.tobytes()
        self.blocks.append((*self.spill.write(data), len(self.starts)))
        self.starts, self.durs, self.names = array("d"), array("d"), array("q")

    def _load(self) -> bool:
        """Make the next unreplayed block of the log the replay's head."""
        if self.blocks:
            at, length, n = self.blocks.popleft()
            data = self.spill.read(at, length)
            starts, durs, names = array("d"), array("d"), array("q")
            starts.frombytes(data[: 8 * n])
            durs.frombytes(data[8 * n : 16 * n])
            names.frombytes(data[16 * n :])
        elif self.starts:
            starts, durs, names = self.starts, self.durs, self.names
            self.starts, self.durs, self.names = array("d"), array("d"), array("q")
        else:
            return False
        self.head = zip(starts, durs, names)  # noqa: B905 (same length by construction)
        return True

    def _ops(self) -> Iterator[tuple[float, float, int]]:
        if self.peek is not None:
            peek, self.peek = self.peek, None
            return itertools.chain((peek,), self.head)
        return self.head

    def replay(self, until: float) -> None:
        """Replay the logged operators that start at or before ``until``: the whole view,
        and the marked view (the rules of ``trace.rules``) when the trace has markers."""
        if until > self.replayed_to:
            self.replayed_to = until
        totals, stack, marks, pid = self.totals, self.stack, self.totals.marks, self.pid
        count, self_cpu, total_cpu = totals.count, totals.self_cpu, totals.total_cpu
        m_count, m_self, m_total = totals.m_count, totals.m_self_cpu, totals.m_total_cpu
        span_start, span_end = totals.span_start, totals.span_end
        candidates = self.candidates
        marked = self.marked
        top_level = m_top = 0
        ops = self._ops()
        while True:
            for op in ops:
                start, dur, index = op
                if start > until:
                    self.peek = op
                    break
                while stack and stack[-1][0] <= start:
                    popped = stack.pop()
                    if candidates:
                        self._fold(popped)
                if index < 0:  # a marker: not an operator; what runs inside counts
                    if not stack or stack[-1][2] == NOT_COUNTED:  # an outermost marker
                        totals.m_wall_us += dur
                        totals.m_calls += 1
                    if stack and candidates:
                        self._child(stack[-1], index)  # a second child of its parent
                    self.prev = (start + dur, index, MARKER)
                    stack.append(self.prev)
                    continue
                count[index] += 1
                total_cpu[index] += dur
                self_cpu[index] += dur
                end = start + dur
                if start < span_start:
                    span_start = start
                if end > span_end:
                    span_end = end
                fold = None
                if stack:
                    entry = stack[-1]
                    _, parent, state = entry
                    if parent >= 0:
                        self_cpu[parent] -= dur
                    if (candidates or entry is self.prev) and self._child(entry, index):
                        fold = entry
                    if state == COUNTED:
                        m_self[parent] -= dur
                    elif state == MARKER:
                        state = COUNTED
                        m_top += 1
                else:
                    top_level += 1
                    state = COUNTED if marked and marks.covers(pid, start) else NOT_COUNTED
                    m_top += state
                if state:
                    m_count[index] += 1
                    m_total[index] += dur
                    m_self[index] += dur
                if fold is not None:
                    candidates[id(fold)] = (index, dur, state)
                self.prev = (end, index, state)
                stack.append(self.prev)
            else:
                if self._load():
                    ops = self.head
                    continue
            break
        totals.top_level += top_level
        totals.m_top_level += m_top
        totals.span_start, totals.span_end = span_start, span_end

    def place_pending(self, links: Links, final: bool = False) -> None:
        """Place the waiting runtime calls that all later operators start after.

        Unless ``final``, the latest ``LAUNCH_WINDOW`` calls keep waiting, so calls written
        slightly out of time order are still placed in order.
        """
        pending = sorted(self.pending)
        ready = len(pending)
        if not final:  # operators that start before a waiting call may still come
            ready = min(ready - LAUNCH_WINDOW, bisect.bisect_left(pending, (self.last_start,)))
        if ready > 0 and pending[0][0] < self.placed_until:
            raise OutOfOrder("runtime calls of a thread out of time order beyond the window")
        stack, candidates, launch = self.stack, self.candidates, links.launch
        for ts, correlation in pending[:ready]:
            self.replay(ts)
            while stack and stack[-1][0] < ts:  # ended before the call
                popped = stack.pop()
                if candidates:
                    self._fold(popped)
            if stack:
                _, index, state = stack[-1]
                launch(correlation, IN_MARKER if state == MARKER else 2 * index + state)
            else:
                launch(correlation, -1)
        if ready > 0:
            self.placed_until = pending[ready - 1][0]
        self.pending = pending[ready:]
        # calls written before their operators cannot be placed yet: wait for twice as many
        self.check_at = max(2 * LAUNCH_WINDOW, 2 * len(self.pending))
        if final:
            self.replay(math.inf)
            self.end_all()
