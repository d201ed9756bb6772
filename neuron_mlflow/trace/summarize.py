"""Per-op summaries from trace files of any accelerator, the same as a live window's, by the
rules of ``docs/metrics.md`` ("What counts in a window"): one streamed pass in flat memory
(:mod:`neuron_mlflow.trace.streaming`), or for a file out of the order trace writers use the
exact pass (:mod:`neuron_mlflow.trace.buffered`).

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

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.naming import RECORDED_STEPS_KEY
from neuron_mlflow.summary.ops import OpSummary, RawOp, build_summary
from neuron_mlflow.trace.buffered import buffered_pass
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.streaming import streaming_pass
from neuron_mlflow.trace.totals import Totals, View

logger = logging.getLogger("neuron_mlflow")
MAX_SHAPES = 4  # input signatures listed per operator row


@dataclass
class TraceResult:
    """What a trace file says, summarised like a live window.

    Attributes:
        summary: the op summary (per profiled step).
        kernels: device time per device event name (window total, us).
        unattributed_device_events: device events not linked to any operator.
        device_events: device events counted (in a marked trace, those launched inside).
        device_busy_pct: busy share of the device span (union of device events), or ``None``.
        rank: from ``distributedInfo`` when present.
        metadata: the file's other top-level keys.
        marked: the trace holds marked ranges, so only what runs inside them counted
            (:mod:`neuron_mlflow.trace.rules`).
    """

    summary: OpSummary
    kernels: dict[str, float] = field(default_factory=dict)
    unattributed_device_events: int = 0
    device_events: int = 0
    device_busy_pct: float | None = None
    rank: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    marked: bool = False


def summarize_trace(path: str | Path, device_label: str | None = None) -> TraceResult:
    """Summarise one trace file, in memory that stays flat as files grow.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        device_label: the device column label; default from the device categories seen.

    Raises:
        TraceFormatError: the file is truncated or malformed.
    """
    stream = TraceStream(path, typed=True)
    try:
        totals = streaming_pass(stream.batches())
    except OutOfOrder as reason:
        logger.info("%s: %s; reading it again with the buffered pass", path, reason)
        stream = TraceStream(path, typed=True)
        totals = buffered_pass(stream)
    return _result(totals, stream.metadata, device_label)


def _merged_ops(totals: Totals, view: View) -> list[RawOp]:
    """Operator rows by name: input signatures merged, their shapes listed (most calls first)."""
    rows: dict[str, list[float]] = {}
    shapes: dict[str, list[tuple[float, str]]] = {}
    flopped: set[str] = set()
    for i, name in enumerate(totals.names):
        calls = view.count[i]
        if not calls and not view.self_cpu[i] and not view.self_device[i]:
            continue  # a kernel, or nothing counted (an input signature folded away keeps its
            # self time: torch's tables fold an only child of the same name into its parent)
        row = rows.setdefault(name, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += calls
        row[1] += view.self_cpu[i]
        row[2] += view.total_cpu[i]
        row[3] += view.self_device[i]
        row[4] += view.device_total[i]
        if i in totals.flops:
            row[5] += calls * totals.flops[i]
            flopped.add(name)
        if i in totals.shapes:
            shapes.setdefault(name, []).append((-calls, totals.shapes[i]))
    return [
        RawOp(
            name,
            int(r[0]),
            float(r[1]),
            float(r[2]),
            float(r[3]),
            float(r[4]),
            input_shapes=_shapes_cell(shapes[name]) if name in shapes else None,
            flops=r[5] if name in flopped else None,
        )
        for name, r in rows.items()
    ]


def _shapes_cell(signatures: list[tuple[float, str]]) -> str:
    ordered = [text for _, text in sorted(signatures)]
    more = len(ordered) - MAX_SHAPES
    return "; ".join(ordered[:MAX_SHAPES]) + (f"; ... (+{more})" if more > 0 else "")


def _result(totals: Totals, metadata: dict[str, Any], device_label: str | None) -> TraceResult:
    """The summary and trace facts from a pass's totals (the view the rules say applies)."""
    recorded = metadata.get(RECORDED_STEPS_KEY)
    view = totals.counted(int(str(recorded)) if str(recorded).isdigit() else None)
    kernels = {totals.names[i]: us for i, us in view.kernel_us.items()}
    label = device_label or (sorted(totals.labels)[0] if totals.labels else None)
    device_rows = [RawOp(name, 1, 0.0, 0.0, us, us) for name, us in kernels.items()]
    summary = build_summary(
        _merged_ops(totals, view),
        view.top_level,
        view.steps,
        view.wall_us,
        label,
        device_rows or None,
        peak_allocated_bytes=view.peaks,
    )
    info = metadata.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    return TraceResult(
        summary=summary,
        kernels=kernels,
        unattributed_device_events=view.device_events - view.attributed,
        device_events=view.device_events,
        device_busy_pct=totals.busy_pct,
        rank=int(rank) if isinstance(rank, int) else None,
        metadata=metadata,
        marked=bool(totals.marks),
    )
