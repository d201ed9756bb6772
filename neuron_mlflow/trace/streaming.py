"""The streaming trace pass: aggregates as it reads, in memory that does not grow with the file.

- Operators: a stack of open operators per thread gives calls, self and total CPU time and
  top-level calls as each operator arrives. Each thread's operators must come in start order
  (torch and Kineto write them so).
- Runtime calls -> operators: each thread's operators are also logged (start, end, name id:
  24 bytes) and replayed in step with that thread's runtime calls, which are placed in time
  order in batches. The unreplayed part of the log spills to a temporary file in blocks, so
  a file that writes every CPU operator before any runtime call (Kineto's usual layout)
  needs no more memory than one that interleaves them.
- Runtime calls <-> device events: joined by correlation id; whichever comes first waits
  for the other. Placed launches live in two in-memory generations; older ones spill.
- Device busy time: the union of device intervals, merged in start order with a reordering
  window.

Where a file breaks these orders beyond the windows, :class:`OutOfOrder` is raised and
:func:`neuron_mlflow.trace.summarize.summarize_trace` reads the file again with the buffered
pass (:mod:`neuron_mlflow.trace.buffered`).

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.trace.reader import TraceStream
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps([
    ...     {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
    ...     {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
    ... ]))
    >>> totals = streaming_pass(TraceStream(path, typed=True))
    >>> totals.names, totals.self_cpu, totals.top_level
    (['outer', 'inner'], [7.0, 3.0], 1)
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import tempfile
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from typing import IO, Any

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.totals import (
    DEVICE_CATEGORIES,
    OP_CATEGORIES,
    RUNTIME_CATEGORIES,
    STEP_MARKER,
    Totals,
)

BLOCK_OPS = 1 << 15  # logged operators per thread kept in memory before they spill
LAUNCH_WINDOW = 1 << 12  # runtime calls per thread held back to be placed in time order
REORDER_EVENTS = 1 << 13  # device intervals held back to be merged in start order
LAUNCHES_IN_MEMORY = 1 << 15  # placed launches per in-memory generation


class Spill:
    """One temporary file holding blocks of bytes, created on first use."""

    def __init__(self) -> None:
        self.file: IO[bytes] | None = None
        self.size = 0

    def write(self, data: bytes) -> tuple[int, int]:
        """Append ``data``; return its (offset, length)."""
        if self.file is None:  # closed by close()
            self.file = tempfile.TemporaryFile(prefix="neuron-mlflow-trace-")  # noqa: SIM115
        view, at = memoryview(data), self.size
        while view:
            written = os.pwrite(self.file.fileno(), view, self.size)
            view, self.size = view[written:], self.size + written
        return at, len(data)

    def read(self, at: int, length: int) -> bytes:
        assert self.file is not None
        return os.pread(self.file.fileno(), length, at)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class Thread:
    """One thread's operator log, replayed in step with its runtime calls.

    Operators are logged as they arrive (start, duration, name id: 24 bytes each) and
    replayed (call tree, totals, placing runtime calls) only as far as the thread's
    runtime calls need, or at the end: a runtime call may be written long after the
    operators around it. The unreplayed log spills to disk in blocks of ``BLOCK_OPS``.
    """

    __slots__ = (
        "blocks",
        "check_at",
        "durs",
        "head",
        "last_dur",
        "last_start",
        "names",
        "peek",
        "pending",
        "placed_until",
        "spill",
        "stack",
        "starts",
        "totals",
    )

    def __init__(self, totals: Totals, spill: Spill) -> None:
        self.totals = totals
        self.spill = spill
        self.last_start = -math.inf
        self.last_dur = 0.0
        self.pending: list[tuple[float, int]] = []  # (ts, correlation) of runtime calls
        self.check_at = 2 * LAUNCH_WINDOW  # place the waiting calls when this many wait
        self.starts, self.durs, self.names = array("d"), array("d"), array("q")  # log tail
        self.blocks: deque[tuple[int, int, int]] = deque()  # (offset, length, operators)
        self.head: Iterator[tuple[float, float, int]] = iter(())
        self.peek: tuple[float, float, int] | None = None
        self.stack: list[tuple[float, int]] = []  # (end, name id) open at the replay point
        self.placed_until = -math.inf

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

    def replay(self, until: float) -> None:
        """Replay the logged operators that start at or before ``until``."""
        totals, stack = self.totals, self.stack
        count, self_cpu, total_cpu = totals.count, totals.self_cpu, totals.total_cpu
        top_level, span_start, span_end = 0, totals.span_start, totals.span_end
        if self.peek is not None:
            ops: Iterator[tuple[float, float, int]] = itertools.chain((self.peek,), self.head)
            self.peek = None
        else:
            ops = self.head
        while True:
            for op in ops:
                start, dur, index = op
                if start > until:
                    self.peek = op
                    break
                while stack and stack[-1][0] <= start:
                    stack.pop()
                count[index] += 1
                total_cpu[index] += dur
                self_cpu[index] += dur
                if stack:
                    self_cpu[stack[-1][1]] -= dur
                else:
                    top_level += 1
                end = start + dur
                stack.append((end, index))
                if start < span_start:
                    span_start = start
                if end > span_end:
                    span_end = end
            else:
                if self._load():
                    ops = self.head
                    continue
            break
        totals.top_level += top_level
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
        stack = self.stack
        for ts, correlation in pending[:ready]:
            self.replay(ts)
            while stack and stack[-1][0] < ts:  # ended before the call
                stack.pop()
            links.launch(correlation, stack[-1][1] if stack else -1)
            self.placed_until = ts
        self.pending = pending[ready:]
        # calls written before their operators cannot be placed yet: wait for twice as many
        self.check_at = max(2 * LAUNCH_WINDOW, 2 * len(self.pending))
        if final:
            self.replay(math.inf)


class Links:
    """Runtime call -> operator links joined with device events, in bounded memory.

    Whichever of a launch and its device events comes first waits for the other. Placed
    launches live in two in-memory generations; older ones spill, and are read back only
    if some device event still waits at the end.
    """

    def __init__(self, totals: Totals, spill: Spill) -> None:
        self.totals = totals
        self.spill = spill
        self.spilled: list[tuple[int, int]] = []
        self.current: dict[int, int] = {}
        self.previous: dict[int, int] = {}
        self.waiting: dict[int, list[float]] = {}

    def _attribute(self, name: int, durations: Sequence[float]) -> None:
        if name >= 0:
            self.totals.self_device[name] += sum(durations)
            self.totals.attributed += len(durations)

    def launch(self, correlation: int, name: int) -> None:
        """Runtime call ``correlation`` was made inside operator ``name`` (-1: none)."""
        self.current[correlation] = name
        if len(self.current) >= LAUNCHES_IN_MEMORY:
            if self.previous:
                pairs = array("q", itertools.chain.from_iterable(self.previous.items()))
                self.spilled.append(self.spill.write(pairs.tobytes()))
            self.previous, self.current = self.current, {}
        waiting = self.waiting.pop(correlation, None)
        if waiting:
            self._attribute(name, waiting)

    def device(self, correlation: int, duration: float) -> None:
        """A device event of ``duration`` us, launched by runtime call ``correlation``."""
        name = self.current.get(correlation)
        if name is None:
            name = self.previous.get(correlation)
        if name is None:
            self.waiting.setdefault(correlation, []).append(duration)
        else:
            self._attribute(name, (duration,))

    def finish(self) -> None:
        """Link device events that still wait to launches spilled earlier."""
        for at, length in self.spilled:
            if not self.waiting:
                return
            pairs = array("q")
            pairs.frombytes(self.spill.read(at, length))
            for correlation, name in zip(pairs[::2], pairs[1::2], strict=True):
                waiting = self.waiting.pop(correlation, None)
                if waiting:
                    self._attribute(name, waiting)


class Busy:
    """Union of device intervals, merged in start order.

    Intervals collect in a list; when it holds ``2 * REORDER_EVENTS`` it is sorted and the
    earlier half merged, so intervals up to ``REORDER_EVENTS`` places out of order still
    merge exactly.

    Example:
        >>> busy = Busy()
        >>> for start, end in [(0, 10), (20, 30), (5, 12), (40, 50)]:
        ...     busy.add((start, end))
        >>> busy.pct()
        64.0
    """

    def __init__(self) -> None:
        self.pending: list[tuple[float, float]] = []
        self.add = self.pending.append
        self.watermark = -math.inf
        self.first = self.start = self.end = math.nan
        self.busy = 0.0

    def _merge(self, intervals: list[tuple[float, float]]) -> None:
        for start, end in intervals:
            if start < self.watermark:  # behind the merge: exact only inside the last group
                if not start >= self.start:
                    raise OutOfOrder("device events out of order beyond the reordering window")
                self.end = max(self.end, end)
            elif start <= self.end:
                self.end = max(self.end, end)
            elif math.isnan(self.start):
                self.first, self.start, self.end = start, start, end
            else:
                self.busy += self.end - self.start
                self.start, self.end = start, end
        self.watermark = max(self.watermark, intervals[-1][0])

    def flush(self, keep: int | None = None) -> None:
        """Merge all but the ``keep`` (default ``REORDER_EVENTS``) latest-starting intervals."""
        keep = REORDER_EVENTS if keep is None else keep
        if len(self.pending) <= keep:
            return
        self.pending.sort()
        cut = len(self.pending) - keep
        self._merge(self.pending[:cut])
        del self.pending[:cut]

    def pct(self) -> float | None:
        """Busy share (%) of the span from the first start to the last end."""
        self.flush(keep=0)
        if math.isnan(self.start):
            return None
        span = self.end - self.first
        busy = self.busy + self.end - self.start
        return 100.0 * busy / span if span > 0 else 100.0


def streaming_pass(stream: TraceStream) -> Totals:
    """Read ``stream`` once, aggregating as it goes.

    Raises:
        OutOfOrder: the file's order is beyond what the pass can place exactly.
        TraceFormatError: the file is truncated or malformed.
    """
    totals = Totals()
    ids = totals.ids
    spill = Spill()
    threads: dict[tuple[Any, Any], Thread] = {}
    links = Links(totals, spill)
    busy = Busy()
    busy_add, busy_pending, busy_limit = busy.add, busy.pending, 2 * REORDER_EVENTS
    try:
        for batch in stream.batches():
            for event in batch:
                if event is None or event.ph != "X":
                    continue
                cat = event.cat
                if cat in OP_CATEGORIES:  # the hot path: kept inline
                    name, start, dur = event.name, event.ts, event.dur
                    if name.startswith(STEP_MARKER):
                        totals.step_marker(cat, dur)
                        continue
                    key = (event.pid, event.tid)
                    thread = threads.get(key)
                    if thread is None:
                        thread = threads[key] = Thread(totals, spill)
                    if start <= thread.last_start and (
                        start < thread.last_start or dur > thread.last_dur
                    ):
                        raise OutOfOrder(f"operators of thread {key} out of start order")
                    thread.last_start = start
                    thread.last_dur = dur
                    index = ids.get(name)
                    if index is None:
                        index = totals.add_name(name)
                    thread.starts.append(start)
                    thread.durs.append(dur)
                    thread.names.append(index)
                    if len(thread.starts) >= BLOCK_OPS:
                        thread.spill_tail()
                elif cat in RUNTIME_CATEGORIES:
                    args = event.args
                    if args is None or args.correlation is None:
                        continue
                    key = (event.pid, event.tid)
                    thread = threads.get(key)
                    if thread is None:
                        thread = threads[key] = Thread(totals, spill)
                    thread.pending.append((event.ts, args.correlation))
                    if len(thread.pending) >= thread.check_at:
                        thread.place_pending(links)
                elif cat in DEVICE_CATEGORIES:
                    totals.device_event(cat, event.name, event.dur)
                    busy_add((event.ts, event.ts + event.dur))
                    if len(busy_pending) >= busy_limit:
                        busy.flush()
                    if event.args is not None and event.args.correlation is not None:
                        links.device(event.args.correlation, event.dur)
        for thread in threads.values():
            thread.place_pending(links, final=True)
        links.finish()
    finally:
        spill.close()
    totals.busy_pct = busy.pct()
    return totals
