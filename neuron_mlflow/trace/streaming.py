"""The streaming trace pass: aggregates as it reads, in memory that does not grow with the file
(how, and the orders it relies on: ``docs/cli.md``, ``summarize``). Each thread's operators are
logged and replayed in step with its runtime calls (:mod:`neuron_mlflow.trace.replay`);
launches, device events and busy time are joined in :mod:`neuron_mlflow.trace.links`. A file
out of those orders raises :class:`OutOfOrder`, and is read again by the buffered pass.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.trace.reader import TraceStream
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps([
    ...     {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
    ...     {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
    ... ]))
    >>> totals = streaming_pass(TraceStream(path, typed=True).batches())
    >>> totals.names, totals.self_cpu, totals.top_level
    (['outer', 'inner'], [7.0, 3.0], 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.naming import STEP_MARKER_PREFIX
from neuron_mlflow.trace import links as _links
from neuron_mlflow.trace import replay as _replay
from neuron_mlflow.trace.links import Busy, Links, Spill
from neuron_mlflow.trace.reader import TraceEvent
from neuron_mlflow.trace.replay import MARKERS, Thread
from neuron_mlflow.trace.totals import DEVICE_CATEGORIES, OP_CATEGORIES, RUNTIME_CATEGORIES, Totals


def add_marker(
    totals: Totals, threads: dict[tuple[Any, Any], Thread], key: tuple[Any, Any], event: Any
) -> int:
    """Note a marked range (``neuron_mlflow: ...``) of thread ``key``; return its (negative) id.

    Raises:
        OutOfOrder: another thread of the process was already replayed past its start.
    """
    pid, start = key[0], event.ts
    for other, thread in threads.items():
        if other != key and other[0] == pid and thread.replayed_to >= start:
            raise OutOfOrder("a marked range written after operators it covers were placed")
    if not totals.marks:
        for thread in threads.values():
            thread.marked = True
    totals.marks.add(pid, start, start + event.dur)
    return totals.marker_id(event.name)


def streaming_pass(batches: Iterable[Sequence[TraceEvent | None]]) -> Totals:
    """Read the events once (``TraceStream.batches()`` of a typed stream), aggregating as it
    goes.

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
    busy_add, busy_pending, busy_limit = busy.add, busy.pending, 2 * _links.REORDER_EVENTS
    kernel_us, labels_add = totals.kernel_us, totals.labels.add
    # the thread of the last operator or runtime call: usually the next one's too
    last_pid: Any = object()
    last_tid: Any = object()
    thread: Thread | None = None
    try:
        for batch in batches:
            for event in batch:
                if event is None:
                    continue
                if event.ph != "X":  # of the rest, only [memory] instants count (peak memory)
                    args = event.args
                    if event.ph == "i" and event.name == "[memory]" and args is not None:
                        allocated, device = args.total_allocated, args.device_type
                        if allocated is not None and device is not None:
                            totals.memory_event(event.pid, event.ts, device, allocated)
                    continue
                cat = event.cat
                if cat in OP_CATEGORIES:  # the hot path: kept inline
                    name, start, dur = event.name, event.ts, event.dur
                    marker = name.startswith(MARKERS)
                    if marker and name.startswith(STEP_MARKER_PREFIX):
                        totals.step_ranges.append((start, dur))
                        continue
                    if event.tid != last_tid or event.pid != last_pid or thread is None:
                        last_pid, last_tid = event.pid, event.tid
                        thread = threads.get((last_pid, last_tid))
                        if thread is None:
                            thread = threads[last_pid, last_tid] = Thread(links, last_pid)
                    if start <= thread.last_start and (
                        start < thread.last_start or dur > thread.last_dur
                    ):
                        key = (event.pid, event.tid)
                        raise OutOfOrder(f"operators of thread {key} out of start order")
                    thread.last_start = start
                    thread.last_dur = dur
                    args = event.args
                    if marker:
                        index = add_marker(totals, threads, (event.pid, event.tid), event)
                    elif args is not None and args.input_dims:
                        dims, concrete = bytes(args.input_dims), bytes(args.concrete_inputs)
                        index = totals.variant_id(name, dims, concrete)
                    else:
                        index = ids.get(name)  # type: ignore[assignment]
                        if index is None:
                            index = totals.name_id(name)
                    thread.starts.append(start)
                    thread.durs.append(dur)
                    thread.names.append(index)
                    ext = args.external_id if args is not None else None
                    thread.exts.append(-1 if ext is None else ext)
                    if len(thread.starts) >= _replay.BLOCK_OPS:
                        thread.spill_tail()
                elif cat in RUNTIME_CATEGORIES:  # a row of its own, inside its operator
                    if event.tid != last_tid or event.pid != last_pid or thread is None:
                        last_pid, last_tid = event.pid, event.tid
                        thread = threads.get((last_pid, last_tid))
                        if thread is None:
                            thread = threads[last_pid, last_tid] = Thread(links, last_pid)
                    # its pending entry: (ts, dur, name id, correlation, External id), -1: none
                    index = ids.get(event.name)  # type: ignore[assignment]
                    if index is None:
                        index = totals.name_id(event.name)
                    args = event.args
                    if args is None:
                        thread.pending.append((event.ts, event.dur, index, -1, -1))
                    else:
                        correlation, ext = args.correlation, args.external_id
                        if ext is None:
                            ext = args.legacy_external_id
                        thread.pending.append(
                            (
                                event.ts,
                                event.dur,
                                index,
                                -1 if correlation is None else correlation,
                                -1 if ext is None else ext,
                            )
                        )
                    if len(thread.pending) >= thread.check_at:
                        thread.place_pending()
                elif cat in DEVICE_CATEGORIES:
                    labels_add(DEVICE_CATEGORIES[cat])
                    totals.device_events += 1
                    kernel = ids.get(event.name)
                    if kernel is None:
                        kernel = totals.name_id(event.name)
                    kernel_us[kernel] = kernel_us.get(kernel, 0.0) + event.dur
                    busy_add((event.ts, event.ts + event.dur))
                    if len(busy_pending) >= busy_limit:
                        busy.flush()
                    if event.args is not None and event.args.correlation is not None:
                        links.device(event.args.correlation, kernel, event.dur)
        for thread in threads.values():
            thread.place_pending(final=True)
        links.finish()
    finally:
        spill.close()
    totals.busy_pct = busy.pct()
    return totals
