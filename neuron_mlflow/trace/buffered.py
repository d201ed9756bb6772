"""The buffered trace pass: exact for files in any order, memory in proportion to the file.

Every operator interval, runtime call and device event is kept (operators in typed arrays,
32 bytes each); at the end each thread's operators are sorted into start order (ties: the
longer one first, so a parent comes before a child that starts with it) and its runtime
calls into time order, and the streaming pass's own machinery
(:mod:`neuron_mlflow.trace.replay`) places them: one definition of the call tree, the
launch links and the busy time for both passes.
:func:`neuron_mlflow.trace.summarize.summarize_trace` uses this pass for files the streaming
pass cannot place in order.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.trace.reader import TraceStream
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps([  # the child is written before its parent
    ...     {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
    ...     {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
    ... ]))
    >>> totals = buffered_pass(TraceStream(path, typed=True))
    >>> totals.names, totals.self_cpu, totals.top_level
    (['inner', 'outer'], [3.0, 7.0], 1)
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from neuron_mlflow.naming import STEP_MARKER_PREFIX
from neuron_mlflow.trace.events import add_marker, op_id, other_event, runtime_call
from neuron_mlflow.trace.links import Busy, Links, Spill
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.replay import MARKERS, Thread
from neuron_mlflow.trace.totals import DEVICE_CATEGORIES, OP_CATEGORIES, RUNTIME_CATEGORIES, Totals


def buffered_pass(stream: TraceStream) -> Totals:
    """Read ``stream`` keeping every event, then place them in order."""
    totals = Totals()
    spill = Spill()  # the machinery's; nothing spills here
    threads: dict[tuple[Any, Any], Thread] = {}
    links = Links(totals, spill)
    busy = Busy()

    def thread_of(event: Any) -> Thread:
        key = (event.pid, event.tid)
        if key not in threads:
            threads[key] = Thread(totals, spill, event.pid)
        return threads[key]

    try:
        for event in stream:
            if event.ph != "X":
                other_event(totals, event)
                continue
            cat = event.cat
            if cat in OP_CATEGORIES:
                if event.name.startswith(STEP_MARKER_PREFIX):
                    totals.step_ranges.append((event.ts, event.dur))
                    continue
                thread = thread_of(event)
                if event.name.startswith(MARKERS):  # nothing is replayed before the end
                    index = add_marker(totals, threads, (event.pid, event.tid), event)
                else:
                    index = op_id(totals, event)
                ext = event.args.external_id if event.args is not None else None
                thread.starts.append(event.ts)
                thread.durs.append(event.dur)
                thread.names.append(index)
                thread.exts.append(-1 if ext is None else ext)
            elif cat in RUNTIME_CATEGORIES:
                thread_of(event).pending.append(runtime_call(totals, event))
            elif cat in DEVICE_CATEGORIES:
                kernel = totals.device_event(cat, event.name, event.dur)
                busy.add((event.ts, event.ts + event.dur))
                if event.args is not None and event.args.correlation is not None:
                    links.device(event.args.correlation, kernel, event.dur)
        for thread in threads.values():
            starts, durs = np.array(thread.starts), np.array(thread.durs)
            names, exts = np.array(thread.names), np.array(thread.exts)
            order = np.lexsort((-durs, starts))  # stable: file order breaks exact ties
            thread.starts = array("d", starts[order].tobytes())
            thread.durs = array("d", durs[order].tobytes())
            thread.names = array("q", names[order].astype(np.int64).tobytes())
            thread.exts = array("q", exts[order].astype(np.int64).tobytes())
            thread.place_pending(links, final=True)
        links.finish()
    finally:
        spill.close()
    totals.busy_pct = busy.pct()
    return totals
