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

import bisect
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _busy_pct(intervals: list[tuple[float, float]]) -> float | None:
    if not intervals:
        return None
    intervals.sort()
    busy, span_start = 0.0, intervals[0][0]
    cur_start, cur_end = intervals[0]
    span_end = cur_end
    for start, end in intervals[1:]:
        span_end = max(span_end, end)
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    span = span_end - span_start
    return 100.0 * busy / span if span > 0 else 100.0


def summarize_trace(path: str | Path, device_label: str | None = None) -> TraceResult:
    """Summarise one trace file.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        device_label: the device column label; default from the device categories seen.

    Raises:
        TraceFormatError: the file is truncated or malformed.
    """
    stream = TraceStream(path)
    names: dict[str, int] = {}
    threads: dict[tuple[Any, Any], _Thread] = defaultdict(_Thread)
    launches: dict[Any, tuple[Any, Any, float]] = {}
    device: list[tuple[Any, int, float, float]] = []
    labels: set[str] = set()
    step_durs: list[float] = []
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
            thread = threads[(event.get("pid"), event.get("tid"))]
            thread.starts.append(ts)
            thread.durs.append(dur)
            thread.names.append(names.setdefault(name, len(names)))
        elif cat in RUNTIME_CATEGORIES:
            correlation = (event.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = (event.get("pid"), event.get("tid"), ts)
        elif cat in DEVICE_CATEGORIES:
            labels.add(DEVICE_CATEGORIES[cat])
            name = str(event.get("name", "?"))
            correlation = (event.get("args") or {}).get("correlation")
            device.append((correlation, names.setdefault(name, len(names)), ts, dur))
    by_id = {i: n for n, i in names.items()}

    count: dict[int, int] = defaultdict(int)
    self_cpu: dict[int, float] = defaultdict(float)
    total_cpu: dict[int, float] = defaultdict(float)
    top_level = 0
    span_start, span_end = float("inf"), float("-inf")
    sorted_threads: dict[tuple[Any, Any], tuple[list[float], list[float], list[int]]] = {}
    for key, thread in threads.items():
        order = sorted(range(len(thread.starts)), key=lambda i: (thread.starts[i], -thread.durs[i]))
        starts = [thread.starts[i] for i in order]
        durs = [thread.durs[i] for i in order]
        ids = [thread.names[i] for i in order]
        sorted_threads[key] = (starts, durs, ids)
        stack: list[tuple[float, int]] = []  # (end, index)
        for i, (start, dur, name_id) in enumerate(zip(starts, durs, ids, strict=True)):
            end = start + dur
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                self_cpu[ids[stack[-1][1]]] -= dur
            else:
                top_level += 1
            count[name_id] += 1
            self_cpu[name_id] += dur
            total_cpu[name_id] += dur
            span_start, span_end = min(span_start, start), max(span_end, end)
            stack.append((end, i))

    self_device: dict[int, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    unattributed = 0
    for correlation, name_id, _ts, dur in device:
        kernels[by_id[name_id]] += dur
        launch = launches.get(correlation)
        if launch is None or (launch[0], launch[1]) not in sorted_threads:
            unattributed += 1
            continue
        starts, durs, ids = sorted_threads[(launch[0], launch[1])]
        i = bisect.bisect_right(starts, launch[2]) - 1
        while i >= 0 and starts[i] + durs[i] < launch[2]:
            i -= 1
        if i < 0:
            unattributed += 1
            continue
        self_device[ids[i]] += dur
    label = device_label or (sorted(labels)[0] if labels else None)
    steps = max(len(step_durs), 1)
    wall = sum(step_durs) if step_durs else max(span_end - span_start, 0.0)
    raw = [
        RawOp(
            by_id[i],
            count[i],
            self_cpu[i],
            total_cpu[i],
            self_device.get(i, 0.0),
            self_device.get(i, 0.0),
        )
        for i in count
    ]
    device_rows = [RawOp(name, 1, 0.0, 0.0, us, us) for name, us in kernels.items()]
    summary = build_summary(raw, top_level, steps, wall, label, device_rows or None)
    info = stream.metadata.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    return TraceResult(
        summary=summary,
        kernels=dict(kernels),
        unattributed_device_events=unattributed,
        device_events=len(device),
        device_busy_pct=_busy_pct([(ts, ts + dur) for _, _, ts, dur in device]),
        rank=int(rank) if isinstance(rank, int) else None,
        metadata=stream.metadata,
    )
