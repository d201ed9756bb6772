"""One thread's operators, logged and replayed in step with its runtime calls: the call tree,
self and total times, top-level calls, the marked view, runtime calls as rows and the call
path of each call's operator, by the rules of ``docs/metrics.md`` ("Per-operator numbers").

Example:
    >>> from neuron_mlflow.trace.links import Links, Spill
    >>> from neuron_mlflow.trace.totals import Totals
    >>> totals = Totals()
    >>> links = Links(totals, Spill())
    >>> thread = Thread(links, pid=1)
    >>> thread.starts.extend([0.0, 2.0])  # the log: "outer" [0, 10], "inner" [2, 5]
    >>> thread.durs.extend([10.0, 3.0])
    >>> thread.names.extend([totals.name_id("outer"), totals.name_id("inner")])
    >>> thread.exts.extend([1, 2])
    >>> launch = totals.name_id("cudaLaunchKernel")
    >>> thread.pending.append((3.0, 1.0, launch, 7, 2))  # a runtime call inside "inner"
    >>> thread.place_pending(final=True)
    >>> totals.self_cpu, totals.count, totals.nodes[links.current[7]][2]  # its device total's ops
    ([7.0, 2.0, 1.0], [1.0, 1.0, 1.0], (0, 1))
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
from neuron_mlflow.naming import CALL_MARKER_PREFIX, STEP_MARKER_PREFIX
from neuron_mlflow.trace.links import IN_MARKER, Links

BLOCK_OPS = 1 << 15  # logged operators per thread kept in memory before they spill
LAUNCH_WINDOW = 1 << 12  # runtime calls per thread held back to be placed in time order
MARKERS = (STEP_MARKER_PREFIX, CALL_MARKER_PREFIX)
NOT_COUNTED, COUNTED, MARKER = 0, 1, 2  # an open operator's state in the marked view


Entry = tuple[float, int, int, int]  # an open operator: (end, name id, state, External id)


class Thread:
    """One thread's operator log (start, duration, name id, External id; spilled in blocks of
    ``BLOCK_OPS``), replayed only as far as its runtime calls need, or at the end: a runtime
    call may be written long after the operators around it."""

    def __init__(self, links: Links, pid: Any) -> None:
        self.links = links
        self.totals = totals = links.totals
        self.spill = links.spill
        self.pid = pid
        self.marked = bool(totals.marks)  # keep the marked view (set when a marker is read)
        self.last_start = -math.inf
        self.last_dur = 0.0
        # runtime calls: (ts, dur, name id, correlation, External id), -1 for "none"
        self.pending: list[tuple[float, float, int, int, int]] = []
        self.check_at = 2 * LAUNCH_WINDOW  # place the waiting calls when this many wait
        self.starts, self.durs = array("d"), array("d")  # the log's tail
        self.names, self.exts = array("q"), array("q")
        self.blocks: deque[tuple[int, int, int]] = deque()  # (offset, length, operators)
        self.head: Iterator[tuple[float, float, int, int]] = iter(())
        self.peek: tuple[float, float, int, int] | None = None
        self.stack: list[Entry] = []
        self.placed_until = -math.inf
        self.replayed_to = -math.inf
        # an only child of the same name is folded into its parent, as torch's tables do
        # (``EventList._remove_dup_nodes``): a first child of the same name waits here, by its
        # parent's id, until the parent ends (folded) or gets a second child or a call (kept)
        self.candidates: dict[int, tuple[int, float, int, Entry]] = {}
        self.prev: Entry | None = None  # the entry replayed last (None: a call came after it)
        # ``path_nodes[i]``: the call path (``Totals.node``) of ``path_entries[i]``, reused
        # while that entry is still ``stack[i]`` (the entries under it stay until it is popped)
        self.path_entries: list[Entry] = []
        self.path_nodes: list[int] = []
        # launches made under a folding candidate wait until it is decided: (correlation,
        # the stack up to the call's operator); ``folded``: those decided "folded", by id
        # (each kept alive here, so that no later entry can take its id)
        self.held: list[tuple[int, list[Entry]]] = []
        self.folded: dict[int, Entry] = {}

    def _decided(self, child: Entry, folded: bool) -> None:
        """A folding candidate is decided: release the launches that waited on it."""
        if self.held:
            if folded:
                self.folded[id(child)] = child
            self._release()

    def _fold(self, entry: Entry) -> None:
        """``entry`` ends: fold its only child of the same name, if it waits."""
        child = self.candidates.pop(id(entry), None)
        if child is not None:
            index, dur, state, child_entry = child
            totals = self.totals
            totals.count[index] -= 1
            totals.total_cpu[index] -= dur
            if state == COUNTED:
                totals.m_count[index] -= 1
                totals.m_total_cpu[index] -= dur
            self._decided(child_entry, True)

    def _child(self, parent: Entry, index: int) -> bool:
        """A new operator ``index`` under ``parent``: True if it may be folded into it."""
        candidates = self.candidates
        if candidates and id(parent) in candidates:  # a second child: keep the first
            self._decided(candidates.pop(id(parent))[3], False)
            return False
        names = self.totals.names
        return parent is self.prev and parent[1] >= 0 and names[parent[1]] == names[index]

    def spill_tail(self) -> None:
        """Move the log's tail to the spill file (called when it reaches ``BLOCK_OPS``)."""
        data = b"".join(a.tobytes() for a in (self.starts, self.durs, self.names, self.exts))
        self.blocks.append((*self.spill.write(data), len(self.starts)))
        self.starts, self.durs = array("d"), array("d")
        self.names, self.exts = array("q"), array("q")

    def _load(self) -> bool:
        """Make the next unreplayed block of the log the replay's head."""
        if self.blocks:
            at, length, n = self.blocks.popleft()
            data = self.spill.read(at, length)
            columns: list[array[Any]] = [
                array(code, data[8 * n * i : 8 * n * (i + 1)]) for i, code in enumerate("ddqq")
            ]
        elif self.starts:
            columns = [self.starts, self.durs, self.names, self.exts]
            self.starts, self.durs = array("d"), array("d")
            self.names, self.exts = array("q"), array("q")
        else:
            return False
        self.head = zip(*columns)  # noqa: B905 (same length by construction)
        return True

    def replay(self, until: float, before: bool = False) -> None:
        """Replay the logged operators that start at or before ``until`` (``before``: only
        those that start before it): the whole view, and the marked view (the rules of
        ``trace.rules``) when the trace has markers."""
        if until > self.replayed_to:
            self.replayed_to = until
        totals, stack, candidates = self.totals, self.stack, self.candidates
        count, self_cpu, total_cpu = totals.count, totals.self_cpu, totals.total_cpu
        m_count, m_self, m_total = totals.m_count, totals.m_self_cpu, totals.m_total_cpu
        span_start, span_end, names = totals.span_start, totals.span_end, totals.names
        marked, marks, pid = self.marked, totals.marks, self.pid
        top_level = m_top = 0
        ops = self.head
        if self.peek is not None:  # the operator the last replay stopped at comes first
            ops = itertools.chain((self.peek,), ops)
            self.peek = None
        while True:
            for op in ops:
                start, dur, index, ext = op
                if start >= until and (start > until or before):
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
                    self.prev = (start + dur, index, MARKER, ext)
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
                    parent, state = entry[1], entry[2]
                    if parent >= 0:
                        self_cpu[parent] -= dur
                    if candidates:
                        if self._child(entry, index):
                            fold = entry
                    elif entry is self.prev and parent >= 0 and names[parent] == names[index]:
                        fold = entry  # a first child of the same name (``_child``, inlined)
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
                prev = self.prev = (end, index, state, ext)
                if fold is not None:
                    candidates[id(fold)] = (index, dur, state, prev)
                stack.append(prev)
            else:
                if self._load():
                    ops = self.head
                    continue
            break
        if top_level:
            totals.top_level += top_level
        if m_top:
            totals.m_top_level += m_top
        totals.span_start, totals.span_end = span_start, span_end

    def _find(self, ext: int, end: float) -> int:
        """The stack position of the open operator with External id ``ext`` that lasts
        until ``end`` or later; -1 if none."""
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][3] == ext:
                return i if end <= stack[i][0] else -1
        return -1

    def _path(self, entries: list[Entry]) -> int:
        """The call path (``Totals.node``) of ``entries[-1]``, an operator, under the
        entries before it (markers are transparent), worked out afresh: for launches
        that waited (``held``), whose entries may be closed and folded by now."""
        totals, folded, node = self.totals, self.folded, -1
        kids = totals.node_kids
        for entry in entries:
            index = entry[1]
            if index >= 0:
                key = index << 2 | (entry[2] == COUNTED) << 1 | (id(entry) in folded)
                found = kids[node + 1].get(key)
                node = totals.new_node(node, key) if found is None else found
        return node

    def _release(self) -> None:
        """Register the held launches whose folding candidates are all decided."""
        waiting = {id(c[3]) for c in self.candidates.values()}
        held, self.held = self.held, []
        for correlation, entries in held:
            if waiting and any(id(e) in waiting for e in entries):
                self.held.append((correlation, entries))
            else:
                self.links.launch(correlation, self._path(entries))
        if not self.held:
            self.folded.clear()

    def place_pending(self, final: bool = False) -> None:
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
        # The hot loop, once per runtime call: what nearly every call takes is inlined here
        # (closing the operators that ended, the innermost one's External id, the call's
        # row, its call path; the rare steps stay in ``_find`` and ``_path``),
        # and ``replay`` is entered only when a logged operator starts early enough to
        # matter (``peek``: the next one; None when not known).
        stack, candidates, replay = self.stack, self.candidates, self.replay
        totals, launch = self.totals, self.links.launch
        path_entries, path_nodes = self.path_entries, self.path_nodes
        folded, node_kids, new_node = self.folded, totals.node_kids, totals.new_node
        count, self_cpu, total_cpu = totals.count, totals.self_cpu, totals.total_cpu
        m_count, m_self, m_total = totals.m_count, totals.m_self_cpu, totals.m_total_cpu
        for ts, dur, index, correlation, ext in itertools.islice(pending, ready):
            peek = self.peek
            if peek is None or peek[0] < ts or (ext < 0 and peek[0] == ts):
                replay(ts, before=ext >= 0)
                peek = self.peek
            while stack and stack[-1][0] < ts:  # ended before the call
                popped = stack.pop()
                if candidates:
                    self._fold(popped)
            at = -1
            if ext >= 0:  # the operator the call names, even where its ends tie with others'
                at = len(stack) - 1
                if at >= 0 and stack[at][3] == ext:  # usually the innermost one
                    if ts + dur > stack[at][0]:
                        at = -1
                else:
                    at = self._find(ext, ts + dur)
                if at < 0 and peek is not None and peek[0] == ts:  # or one starting with it
                    top = stack[-1] if stack else None
                    replay(ts)
                    while stack and stack[-1][0] < ts:
                        popped = stack.pop()
                        if candidates:
                            self._fold(popped)
                    if stack and stack[-1] is not top:
                        at = self._find(ext, ts + dur)
            if at < 0:  # else the innermost operator open at the call's start
                at = len(stack) - 1
                if at < 0:
                    if correlation >= 0:
                        launch(correlation, -1)
                    continue
            # the call: a row of its own (one call, its time), out of its operator's self
            # time; its device events go to that operator's call path
            entry = stack[at]
            parent, state = entry[1], entry[2]
            if parent < 0:  # directly inside a marked range: not a row, its device time counts
                if correlation >= 0:
                    launch(correlation, IN_MARKER)
                continue
            if candidates and id(entry) in candidates:  # a second child: keep the first
                self._decided(candidates.pop(id(entry))[3], False)
            if entry is self.prev:  # its first child: a same-name operator after it is not folded
                self.prev = None
            count[index] += 1
            self_cpu[index] += dur
            total_cpu[index] += dur
            self_cpu[parent] -= dur
            if state == COUNTED:
                m_count[index] += 1
                m_self[index] += dur
                m_total[index] += dur
                m_self[parent] -= dur
            if correlation < 0:
                continue
            if candidates:
                waiting = {id(c[3]) for c in candidates.values()}
                if any(id(e) in waiting for e in stack[: at + 1]):
                    self.held.append((correlation, stack[: at + 1]))
                    continue
            # its call path (``_path``, inlined): known while it stays open, else worked out
            # from the deepest entry under it whose path is known
            known = len(path_entries)
            if at < known and path_entries[at] is entry:
                launch(correlation, path_nodes[at])
                continue
            i = at if at < known else known
            while i and path_entries[i - 1] is not stack[i - 1]:
                i -= 1
            node = path_nodes[i - 1] if i else -1
            for j in range(i, at + 1):
                entry = stack[j]
                op = entry[1]
                if op >= 0:  # markers are transparent
                    key = op << 2 | (entry[2] == COUNTED) << 1
                    if folded and id(entry) in folded:
                        key |= 1
                    found = node_kids[node + 1].get(key)
                    node = new_node(node, key) if found is None else found
                if j < known:
                    path_entries[j] = entry
                    path_nodes[j] = node
                else:
                    path_entries.append(entry)
                    path_nodes.append(node)
            launch(correlation, node)
        if ready > 0:
            self.placed_until = pending[ready - 1][0]
            self.replayed_to = max(self.replayed_to, self.placed_until)
        self.pending = pending[ready:]
        # calls written before their operators cannot be placed yet: wait for twice as many
        self.check_at = max(2 * LAUNCH_WINDOW, 2 * len(self.pending))
        if final:  # close the operators still open at the end of the trace
            self.replay(math.inf)
            while stack:
                self._fold(stack.pop())
            if self.held:  # nothing is undecided any more
                self._release()
