"""Runtime call <-> device event joins and device busy time, in bounded memory.

A launch is stored as one integer *code*: the call path (``Totals.node``, >= 0) of the
operator that made the runtime call (its self device time; every operator on the path gets
the time in its device total), ``-2`` for a call made directly inside a marked range (no
operator: its device time counts in the window's device total only), ``-1`` for one outside
every operator.

Example:
    >>> from neuron_mlflow.trace.totals import Totals
    >>> totals = Totals()
    >>> outer, op = totals.name_id("aten::linear"), totals.name_id("aten::addmm")
    >>> kernel = totals.name_id("gemm")
    >>> path = totals.new_node(totals.new_node(-1, outer << 2 | 2), op << 2 | 2)
    >>> links = Links(totals, Spill())
    >>> links.device(7, kernel, 4.0)  # the device event comes first and waits
    >>> links.launch(7, path)
    >>> totals.self_device[op], totals.device_total[outer], totals.m_kernel_us
    (4.0, 4.0, {2: 4.0})
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from array import array
from collections.abc import Sequence
from typing import IO

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.trace.totals import Totals

LAUNCHES_IN_MEMORY = 1 << 15  # placed launches per in-memory generation
REORDER_EVENTS = 1 << 13  # device intervals held back to be merged in start order
IN_MARKER = -2
"""Launch code of a runtime call made directly inside a marked range."""


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
        self.waiting: dict[int, list[tuple[int, float]]] = {}

    def _attribute(self, code: int, events: Sequence[tuple[int, float]]) -> None:
        """Add device events ``(kernel id, duration)`` to the launch with ``code``."""
        totals = self.totals
        if code >= 0:
            index, counted, chain, m_chain = totals.nodes[code]
            total = 0 + events[0][1] if len(events) == 1 else sum(dur for _, dur in events)
            totals.self_device[index] += total
            totals.attributed += len(events)
            device_total = totals.device_total
            for op in chain:
                device_total[op] += total
            if not counted:
                return
            totals.m_self_device[index] += total
            totals.m_attributed += len(events)
            device_total = totals.m_device_total
            for op in m_chain:
                device_total[op] += total
        elif code != IN_MARKER:
            return
        totals.m_device_events += len(events)
        kernels = totals.m_kernel_us
        for kernel, dur in events:
            kernels[kernel] = kernels.get(kernel, 0.0) + dur

    def launch(self, correlation: int, code: int) -> None:
        """Runtime call ``correlation`` was made where ``code`` says (see the module doc)."""
        current = self.current
        current[correlation] = code
        if len(current) >= LAUNCHES_IN_MEMORY:
            if self.previous:
                pairs = array("q", itertools.chain.from_iterable(self.previous.items()))
                self.spilled.append(self.spill.write(pairs.tobytes()))
            self.previous, self.current = current, {}
        waiting = self.waiting.pop(correlation, None)
        if waiting:
            self._attribute(code, waiting)

    def device(self, correlation: int, kernel: int, duration: float) -> None:
        """A device event (kernel id ``kernel``) of ``duration`` us, launched by ``correlation``."""
        code = self.current.get(correlation)
        if code is None:
            code = self.previous.get(correlation)
        if code is None:
            self.waiting.setdefault(correlation, []).append((kernel, duration))
            return
        if code >= 0:
            totals = self.totals
            index, counted, chain, _ = totals.nodes[code]
            if not counted:  # the usual case without marked ranges: inline
                totals.self_device[index] += duration
                totals.attributed += 1
                device_total = totals.device_total
                for op in chain:
                    device_total[op] += duration
                return
        self._attribute(code, ((kernel, duration),))

    def finish(self) -> None:
        """Link device events that still wait to launches spilled earlier."""
        for at, length in self.spilled:
            if not self.waiting:
                return
            pairs = array("q")
            pairs.frombytes(self.spill.read(at, length))
            for correlation, code in zip(pairs[::2], pairs[1::2], strict=True):
                waiting = self.waiting.pop(correlation, None)
                if waiting:
                    self._attribute(code, waiting)


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
