"""Per-op summaries from trace files of any accelerator, the same as a live window's.

One pass over the streamed events (:mod:`neuron_mlflow.trace_reader`) keeps only compact
per-thread arrays of operator intervals and the runtime/device links; then:

- self CPU time per operator from the ``cpu_op`` (and ``user_annotation``) call tree of each
  thread; ``ProfilerStep#N`` markers are transparent and excluded;
- top-level operator calls: operators with no parent but a step marker;
- device time per operator: each device event is linked by ``args.correlation`` to the
  runtime call that launched it, and that call to the innermost operator around it;
- per-kernel totals, device events left unattributed, and device busy time vs idle gaps.

Categories by backend: ``kernel``/``gpu_memcpy``/``gpu_memset`` + ``cuda_runtime``/
``cuda_driver`` (CUDA and ROCm), ``mtia_ccp_events`` + ``mtia_runtime`` (MTIA),
``privateuse1_driver`` + ``privateuse1_runtime`` (Neuron and other PrivateUse1 backends).

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps({"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1,
    ...      "ts": 0, "dur": 10},
    ...     {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
    ...      "ts": 2, "dur": 3, "args": {"correlation": 7}},
    ...     {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7,
    ...      "ts": 20, "dur": 40, "args": {"correlation": 7}}]}))
    >>> result = summarize_trace(path)
    >>> result.summary.device_time_us, result.summary.op_calls, result.kernels
    (40.0, 1.0, {'mul_kernel': 40.0})
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neuron_mlflow.summary import OpSummary, RawOp, build_summary
from neuron_mlflow.trace_reader import TraceStream

DEVICE_CATEGORIES = {
    "kernel": "CUDA",
    "gpu_memcpy": "CUDA",
    "gpu_memset": "CUDA",
    "cuda_profiler_range": "CUDA",
    "mtia_ccp_events": "MTIA",
    "privateuse1_driver": "NEURON",
}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "mtia_runtime", "privateuse1_runtime"}
OP_CATEGORIES = {"cpu_op", "user_annotation"}
STEP_MARKER = "ProfilerStep"


@dataclass
class TraceResult:
    """What a trace file says, summarised like a live window.

    Attributes:
        summary: the op summary (per profiled step).
        kernels: device time per device event name (window total, us).
        unattributed_device_events: device events not linked to any operator.
        device_busy_pct: busy share of the device span (union of device events), or ``None``.
        rank: from ``distributedInfo`` when present.
        metadata: the file's other top-level keys.
    """

    summary: OpSummary
    kernels: dict[str, float] = field(default_factory=dict)
    unattributed_device_events: int = 0
    device_events: int = 0
    device_busy_pct: float | None = None
    rank: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class _Thread:
    """Operator intervals of one thread, in compact arrays."""

    __slots__ = ("durs", "names", "starts")

    def __init__(self) -> None:
        self.starts = array("d")
        self.durs = array("d")
        self.names = array("l")


def _busy_pct(starts: Any, ends: Any) -> float | None:
    """Busy share (%) of the span from the first start to the last end (union of intervals)."""
    if len(starts) == 0:
        return None
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running = np.maximum.accumulate(ends)
    previous = np.concatenate(([-np.inf], running[:-1]))
    busy = np.maximum(0.0, running - np.maximum(starts, previous)).sum()
    span = running[-1] - starts[0]
    return float(100.0 * busy / span) if span > 0 else 100.0


def _parents(starts: Any, ends: Any) -> Any:
    """Index of each interval's innermost enclosing interval (-1: top level); sorted input."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[tuple[float, int]] = []
    chunk = 1 << 16
    for base in range(0, len(starts), chunk):  # bounded temporary lists
        for offset, (start, end) in enumerate(
            zip(
                starts[base : base + chunk].tolist(),
                ends[base : base + chunk].tolist(),
                strict=True,
            )
        ):
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                parent[base + offset] = stack[-1][1]
            stack.append((end, base + offset))
    return parent


def summarize_trace(path: str | Path, device_label: str | None = None) -> TraceResult:
    """Summarise one trace file.

    Memory stays small: operator intervals, runtime launches and device events are kept in
    typed arrays (about 24-32 bytes each), never as Python objects per event.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        device_label: the device column label; default from the device categories seen.

    Raises:
        TraceFormatError: the file is truncated or malformed.
    """
    stream = TraceStream(path)
    names: dict[str, int] = {}
    thread_ids: dict[tuple[Any, Any], int] = {}
    threads: list[_Thread] = []
    launch_corr, launch_thread, launch_ts = array("q"), array("q"), array("d")
    dev_corr, dev_name, dev_ts, dev_dur = array("q"), array("q"), array("d"), array("d")
    labels: set[str] = set()
    step_durs: list[float] = []

    def thread_index(event: dict) -> int:
        """Index of the event's (pid, tid) thread, created on first sight."""
        key = (event.get("pid"), event.get("tid"))
        index = thread_ids.get(key)
        if index is None:
            index = thread_ids[key] = len(threads)
            threads.append(_Thread())
        return index

    for event in stream:
        if event.get("ph") != "X":
            continue
        cat = event.get("cat")
        if (
            cat not in OP_CATEGORIES
            and cat not in RUNTIME_CATEGORIES
            and (cat not in DEVICE_CATEGORIES)
        ):
            continue
        try:
            ts = float(event.get("ts", 0))
            dur = float(event.get("dur", 0))
        except (TypeError, ValueError):
            continue
        if cat in OP_CATEGORIES:
            name = str(event.get("name", "?"))
            if name.startswith(STEP_MARKER):
                if cat == "user_annotation":
                    step_durs.append(dur)
                continue
            thread = threads[thread_index(event)]
            thread.starts.append(ts)
            thread.durs.append(dur)
            thread.names.append(names.setdefault(name, len(names)))
        elif cat in RUNTIME_CATEGORIES:
            correlation = (event.get("args") or {}).get("correlation")
            if isinstance(correlation, int):
                launch_corr.append(correlation)
                launch_thread.append(thread_index(event))
                launch_ts.append(ts)
        elif cat in DEVICE_CATEGORIES:
            labels.add(DEVICE_CATEGORIES[cat])
            correlation = (event.get("args") or {}).get("correlation")
            dev_corr.append(correlation if isinstance(correlation, int) else -1)
            dev_name.append(names.setdefault(str(event.get("name", "?")), len(names)))
            dev_ts.append(ts)
            dev_dur.append(dur)
    by_id = {i: n for n, i in names.items()}
    n_names = len(names)

    count = np.zeros(n_names)
    self_cpu = np.zeros(n_names)
    total_cpu = np.zeros(n_names)
    self_device = np.zeros(n_names)
    top_level = 0
    span_start, span_end = np.inf, -np.inf
    ordered: list[tuple[Any, Any, Any, Any]] = []
    for thread in threads:
        starts = np.frombuffer(thread.starts, dtype=np.float64) if thread.starts else np.zeros(0)
        durs = np.frombuffer(thread.durs, dtype=np.float64) if thread.durs else np.zeros(0)
        ids = np.frombuffer(thread.names, dtype=np.int64) if thread.names else np.zeros(0, int)
        order = np.lexsort((-durs, starts))
        starts, durs, ids = starts[order], durs[order], ids[order]
        ends = starts + durs
        parent = _parents(starts, ends)
        child = np.zeros(len(starts))
        nested = parent >= 0
        np.add.at(child, parent[nested], durs[nested])
        count += np.bincount(ids, minlength=n_names)
        self_cpu += np.bincount(ids, weights=durs - child, minlength=n_names)
        total_cpu += np.bincount(ids, weights=durs, minlength=n_names)
        top_level += int((~nested).sum())
        if len(starts):
            span_start, span_end = min(span_start, starts[0]), max(span_end, ends.max())
        ordered.append((starts, ends, ids, parent))
        thread.starts = thread.durs = thread.names = array("d")  # free as we go

    corr = np.frombuffer(dev_corr, dtype=np.int64) if dev_corr else np.zeros(0, np.int64)
    d_name = np.frombuffer(dev_name, dtype=np.int64) if dev_name else np.zeros(0, np.int64)
    d_ts = np.frombuffer(dev_ts, dtype=np.float64) if dev_ts else np.zeros(0)
    d_dur = np.frombuffer(dev_dur, dtype=np.float64) if dev_dur else np.zeros(0)
    attributed = np.zeros(len(corr), dtype=bool)
    if len(corr) and launch_corr:
        l_corr = np.frombuffer(launch_corr, dtype=np.int64)
        l_thread = np.frombuffer(launch_thread, dtype=np.int64)
        l_ts = np.frombuffer(launch_ts, dtype=np.float64)
        by_corr = np.argsort(l_corr, kind="stable")
        sorted_corr = l_corr[by_corr]
        pos = np.searchsorted(sorted_corr, corr).clip(0, len(sorted_corr) - 1)
        found = sorted_corr[pos] == corr
        launch = by_corr[pos]
        for t, (starts, ends, ids, parent) in enumerate(ordered):
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
            np.add.at(self_device, ids[i[ok]], d_dur[rows[ok]])
            attributed[rows[ok]] = True
    kernel_us = np.bincount(d_name, weights=d_dur, minlength=n_names) if len(d_name) else None
    kernels = (
        {by_id[int(i)]: float(kernel_us[i]) for i in np.unique(d_name)}
        if kernel_us is not None
        else {}
    )
    label = device_label or (sorted(labels)[0] if labels else None)
    steps = max(len(step_durs), 1)
    wall = sum(step_durs) if step_durs else max(float(span_end - span_start), 0.0)
    raw = [
        RawOp(
            by_id[i],
            int(count[i]),
            float(self_cpu[i]),
            float(total_cpu[i]),
            float(self_device[i]),
            float(self_device[i]),
        )
        for i in range(n_names)
        if count[i]
    ]
    device_rows = [RawOp(name, 1, 0.0, 0.0, us, us) for name, us in kernels.items()]
    summary = build_summary(raw, top_level, steps, wall, label, device_rows or None)
    info = stream.metadata.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    return TraceResult(
        summary=summary,
        kernels=kernels,
        unattributed_device_events=int(len(corr) - attributed.sum()),
        device_events=len(corr),
        device_busy_pct=_busy_pct(d_ts, d_ts + d_dur),
        rank=int(rank) if isinstance(rank, int) else None,
        metadata=stream.metadata,
    )
