"""Neuron device time that reaches the profiler only through ``prof.events()``.

When the exported framework trace has no device events, this reads the profiler's events by
the trace engine's rules (docs/metrics.md, "What counts in a window").

Example:
    >>> read_device_times([]).device_us
    0.0
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from neuron_mlflow.naming import CALL_MARKER_PREFIX, STEP_MARKER_PREFIX
from neuron_mlflow.summary.ops import OpSummary, RawOp, build_summary
from neuron_mlflow.trace.links import Busy
from neuron_mlflow.trace.rules import Marks


@dataclass
class DeviceTimes:
    """Device time of one window, read from the profiler's events (window totals, us).

    Attributes:
        per_op_us: device time by the name of the operator that launched it.
        per_kernel_us: device time by device event (kernel) name.
        counted_events: device events counted (inside the marked steps).
        outside_events: device events left out (launched outside the marked steps, or not
            linked to any operator).
        busy_pct: busy share of the counted device events' span, ``None`` without intervals.
    """

    per_op_us: dict[str, float] = field(default_factory=dict)
    per_kernel_us: dict[str, float] = field(default_factory=dict)
    counted_events: int = 0
    outside_events: int = 0
    busy_pct: float | None = None

    @property
    def device_us(self) -> float:
        """The window's device time (sum over operators)."""
        return float(sum(self.per_op_us.values()))


def _is_cpu(event: Any) -> bool:
    from torch.autograd import DeviceType

    return bool(event.device_type == DeviceType.CPU)


def _marks(events: list[Any]) -> Marks | None:
    """The marked ranges (one process: ``None``); ``None``: no markers, everything counts."""
    marks = Marks()
    for e in events:
        if e.name.startswith(CALL_MARKER_PREFIX):
            marks.add(None, float(e.time_range.start), float(e.time_range.end))
    return marks or None


def _counts(event: Any, marks: Marks | None) -> bool:
    """Nested in a call marker, or in a call tree whose root starts in a marked range."""
    if marks is None:
        return True
    root = event
    while root.cpu_parent is not None:
        root = root.cpu_parent
        if root.name.startswith(CALL_MARKER_PREFIX):
            return True
    return marks.covers(None, float(root.time_range.start))


def read_device_times(events: Iterable[Any]) -> DeviceTimes:
    """Read device time from ``prof.events()`` (torch ``FunctionEvent`` objects).

    Args:
        events: the window's ``prof.events()`` (torch builds its event tree on first use:
            the Neuron backend reads it only for a trace without device events).

    Returns:
        Device time per launching operator and per kernel, only for the marked steps.
    """
    events = list(events)
    marks = _marks(events)
    per_op: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    counted_ids: set[int] = set()
    launched = 0
    for event in events:
        if not _is_cpu(event) or event.name.startswith((CALL_MARKER_PREFIX, STEP_MARKER_PREFIX)):
            continue
        own = float(event.self_device_time_total or 0.0)
        if own <= 0:
            continue
        launched += 1
        if not _counts(event, marks):
            continue
        per_op[event.name] += own
        counted_ids.add(int(event.id))
        if getattr(event, "is_legacy", False) or not event.kernels:
            per_kernel[event.name] += own
        else:
            for kernel in event.kernels:
                per_kernel[kernel.name] += float(kernel.duration)
    device = [e for e in events if not _is_cpu(e)]
    intervals = [
        (float(e.time_range.start), float(e.time_range.end))
        for e in device
        if int(getattr(e, "linked_correlation_id", 0) or 0) in counted_ids
    ]
    busy = Busy()
    for interval in intervals:
        busy.add(interval)
    return DeviceTimes(
        dict(per_op),
        dict(per_kernel),
        counted_events=len(intervals) if device else len(counted_ids),
        outside_events=len(device) - len(intervals) if device else launched - len(counted_ids),
        busy_pct=busy.pct(),
    )


def with_device_times(summary: OpSummary, times: DeviceTimes) -> OpSummary:
    """The summary of the window's trace with the device times read from its events.

    Operators keep their CPU numbers; each gets the device time it launched. An operator
    that launched device work but is missing from the trace's summary is added with no calls.

    Example:
        >>> s = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0, "NEURON")
        >>> t = DeviceTimes(per_op_us={"aten::mul": 300.0}, per_kernel_us={"k": 300.0})
        >>> merged = with_device_times(s, t)
        >>> merged.device_time_us, merged.ops[0].self_device_us, merged.ops[0].calls
        (150.0, 150.0, 1.0)
    """
    steps = summary.steps
    raw = [
        RawOp(
            op.name,
            round(op.calls * steps),
            op.self_cpu_us * steps,
            op.cpu_total_us * steps,
            times.per_op_us.get(op.name, 0.0),
            times.per_op_us.get(op.name, 0.0),
            input_shapes=op.input_shapes,
            flops=op.flops * steps if op.flops is not None else None,
        )
        for op in summary.ops
    ]
    known = {op.name for op in summary.ops}
    raw += [
        RawOp(name, 0, 0.0, 0.0, us, us)
        for name, us in times.per_op_us.items()
        if name not in known
    ]
    device_rows = [RawOp(name, 1, 0.0, 0.0, us, us) for name, us in times.per_kernel_us.items()]
    merged = build_summary(
        raw,
        top_level_calls=round(summary.op_calls * steps),
        steps=steps,
        wall_time_us=summary.wall_time_us * steps,
        device_label=summary.device_label or "NEURON",
        device_rows=device_rows or None,
        peak_allocated_bytes=summary.peak_allocated_bytes,
    )
    return replace(merged, partial=summary.partial, extra=dict(summary.extra))
