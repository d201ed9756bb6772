"""The buffered trace pass: exact for files in any order, memory in proportion to the file.

Every operator interval, runtime call and device event is kept in typed arrays (about 24-32
bytes each) and sorted at the end: self time from each thread's call tree, device time by
correlation id and the innermost operator around each runtime call, busy time as the union
of device intervals. :func:`neuron_mlflow.trace_summary.summarize_trace` uses it for files
the streaming pass (:mod:`neuron_mlflow.trace_streaming`) cannot place in order.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.trace_reader import TraceStream
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

from neuron_mlflow.trace_reader import TraceStream
from neuron_mlflow.trace_totals import (
    DEVICE_CATEGORIES,
    OP_CATEGORIES,
    RUNTIME_CATEGORIES,
    STEP_MARKER,
    Totals,
)


def _parents(starts: Any, ends: Any) -> Any:
    """Index of each interval's innermost enclosing interval (-1: top level); sorted input."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[tuple[float, int]] = []
    for index, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            parent[index] = stack[-1][1]
        stack.append((end, index))
    return parent


def buffered_pass(stream: TraceStream) -> Totals:
    """The exact pass for files in any order: every interval in arrays, sorted at the end."""
    totals = Totals()
    ids: dict[str, int] = {}
    threads: dict[tuple[Any, Any], tuple[array, array, array]] = {}
    launch_corr, launch_thread, launch_ts = array("q"), array("q"), array("d")
    dev_corr, dev_ts, dev_dur = array("q"), array("d"), array("d")
    thread_ids: dict[tuple[Any, Any], int] = {}

    def thread_index(key: tuple[Any, Any]) -> int:
        if key not in thread_ids:
            thread_ids[key] = len(thread_ids)
            threads[key] = (array("d"), array("d"), array("q"))
        return thread_ids[key]

    for event in stream:
        if event.ph != "X":
            continue
        cat = event.cat
        correlation = event.args.correlation if event.args is not None else None
        if cat in OP_CATEGORIES:
            if event.name.startswith(STEP_MARKER):
                if cat == "user_annotation":
                    totals.steps += 1
                    totals.step_us += event.dur
                continue
            key = (event.pid, event.tid)
            thread_index(key)
            index = ids.get(event.name)
            starts, durs, names = threads[key]
            starts.append(event.ts)
            durs.append(event.dur)
            names.append(totals.name_id(ids, event.name) if index is None else index)
        elif cat in RUNTIME_CATEGORIES and correlation is not None:
            launch_corr.append(correlation)
            launch_thread.append(thread_index((event.pid, event.tid)))
            launch_ts.append(event.ts)
        elif cat in DEVICE_CATEGORIES:
            totals.labels.add(DEVICE_CATEGORIES[cat])
            totals.device_events += 1
            index = ids.get(event.name)
            if index is None:
                index = totals.name_id(ids, event.name)
            totals.kernel_us[index] = totals.kernel_us.get(index, 0.0) + event.dur
            dev_corr.append(-1 if correlation is None else correlation)
            dev_ts.append(event.ts)
            dev_dur.append(event.dur)

    n_names = len(totals.names)
    self_device = np.zeros(n_names)
    self_cpu, total_cpu, count = np.zeros(n_names), np.zeros(n_names), np.zeros(n_names)
    trees: list[tuple[Any, Any, Any, Any]] = []
    for starts_a, durs_a, names_a in threads.values():
        starts = np.array(starts_a, dtype=np.float64)
        durs = np.array(durs_a, dtype=np.float64)
        names = np.array(names_a, dtype=np.int64)
        order = np.lexsort((-durs, starts))
        starts, durs, names = starts[order], durs[order], names[order]
        ends = starts + durs
        parent = _parents(starts, ends)
        child = np.zeros(len(starts))
        nested = parent >= 0
        np.add.at(child, parent[nested], durs[nested])
        count += np.bincount(names, minlength=n_names)
        self_cpu += np.bincount(names, weights=durs - child, minlength=n_names)
        total_cpu += np.bincount(names, weights=durs, minlength=n_names)
        totals.top_level += int((~nested).sum())
        if len(starts):
            totals.span_start = min(totals.span_start, float(starts[0]))
            totals.span_end = max(totals.span_end, float(ends.max()))
        trees.append((starts, ends, names, parent))

    corr = np.array(dev_corr, dtype=np.int64)
    durations = np.array(dev_dur, dtype=np.float64)
    if len(corr) and len(launch_corr):
        l_corr = np.array(launch_corr, dtype=np.int64)
        l_thread = np.array(launch_thread, dtype=np.int64)
        l_ts = np.array(launch_ts, dtype=np.float64)
        by_corr = np.argsort(l_corr, kind="stable")
        sorted_corr = l_corr[by_corr]
        pos = np.searchsorted(sorted_corr, corr).clip(0, len(sorted_corr) - 1)
        found = sorted_corr[pos] == corr
        launch = by_corr[pos]
        for t, (starts, ends, names, parent) in enumerate(trees):
            rows = np.nonzero(found & (l_thread[launch] == t))[0]
            if not len(rows) or not len(starts):
                continue
            at = l_ts[launch[rows]]
            i = np.searchsorted(starts, at, side="right") - 1
            for k in np.nonzero((i >= 0) & (ends[i.clip(0)] < at))[0]:  # ended before: go up
                j = i[k]
                while j >= 0 and ends[j] < at[k]:
                    j = parent[j]
                i[k] = j
            ok = i >= 0
            np.add.at(self_device, names[i[ok]], durations[rows[ok]])
            totals.attributed += int(ok.sum())
    totals.count, totals.self_cpu = count.tolist(), self_cpu.tolist()
    totals.total_cpu, totals.self_device = total_cpu.tolist(), self_device.tolist()
    if len(dev_ts):
        starts = np.array(dev_ts)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], (starts + durations)[order]
        running = np.maximum.accumulate(ends)
        previous = np.concatenate(([-np.inf], running[:-1]))
        union = np.maximum(0.0, running - np.maximum(starts, previous)).sum()
        span = running[-1] - starts[0]
        totals.busy_pct = float(100.0 * union / span) if span > 0 else 100.0
    return totals
