"""The op summary: per-operator times of one window, per profiled step, as plain data
(:func:`build_summary` turns a window's :class:`RawOp` totals into it, without a profiler).

Example:
    >>> raw = [RawOp("aten::mul", 3, 60.9, 60.9, 1164.5, 1164.5),
    ...        RawOp("aten::add", 1, 26.6, 26.6, 434.6, 434.6)]
    >>> s = build_summary(raw, top_level_calls=4, steps=1, wall_time_us=2000.0,
    ...                   device_label="NEURON")
    >>> s.device_time_us, [round(op.device_pct, 1) for op in s.ops]
    (1599.1, [72.8, 27.2])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class RawOp:
    """Window totals of one ``key_averages()`` row, in microseconds (device times optional).

    Example:
        >>> RawOp("aten::mul", 9, 89.5, 89.5).self_device_us is None
        True
    """

    name: str
    count: int
    self_cpu_us: float
    cpu_total_us: float
    self_device_us: float | None = None
    device_total_us: float | None = None
    input_shapes: str | None = None
    flops: float | None = None


@dataclass(frozen=True, slots=True)
class OpStats:
    """One operator of a window, per profiled step.

    ``calls`` and every time are window totals divided by the number of steps. Device fields
    are ``None`` when no device time was measured (never zero for "unknown").

    Example:
        >>> OpStats("aten::mul", 3.0, 60.9, 60.9, 1.0).cpu_pct
        1.0
    """

    name: str
    calls: float
    self_cpu_us: float
    cpu_total_us: float
    cpu_pct: float
    self_device_us: float | None = None
    device_total_us: float | None = None
    device_pct: float | None = None
    input_shapes: str | None = None
    flops: float | None = None


@dataclass(frozen=True, slots=True)
class OpSummary:
    """Per-step summary of one profiling window.

    Attributes:
        steps: profiled (recorded) steps in the window.
        wall_time_us: wall-clock time per step.
        cpu_time_us: self CPU time per step, summed over operators.
        device_time_us: self device time per step, or ``None`` if none was measured.
        op_calls: top-level operator dispatches per step.
        device_label: ``NEURON``, ``CUDA``...; ``None`` for a CPU-only backend.
        ops: operators, sorted by self device time, else self CPU time (descending).
        device_note: why there is no device time, when a device backend measured none.
        partial: the window ended before its last scheduled step.
        flops_per_step: FLOPs per step (``with_flops``), ``None`` when not estimated.
        peak_allocated_bytes: peak allocated bytes per device (``cpu``, ``cuda``, ...) in the
            window (``profile_memory``); empty when not recorded.

    Example:
        >>> s = build_summary([RawOp("aten::add", 2, 10.0, 12.0)], top_level_calls=2,
        ...                   steps=2, wall_time_us=30.0)
        >>> s.cpu_time_us, s.op_calls, s.device_time_us
        (5.0, 1.0, None)
    """

    steps: int
    wall_time_us: float
    cpu_time_us: float
    device_time_us: float | None
    op_calls: float
    device_label: str | None = None
    ops: tuple[OpStats, ...] = ()
    device_note: str | None = None
    partial: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    flops_per_step: float | None = None
    peak_allocated_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def has_device_time(self) -> bool:
        """True when device time was measured for this window."""
        return self.device_time_us is not None

    def top(self, k: int) -> tuple[OpStats, ...]:
        """The first ``k`` operators in summary order.

        Example:
            >>> build_summary([RawOp("a", 1, 1.0, 1.0)], 1, 1, 1.0).top(0)
            ()
        """
        return self.ops[:k]

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``ops`` is a list of dicts).

        Example:
            >>> build_summary([RawOp("a", 1, 1.0, 1.0)], 1, 1, 1.0).to_dict()["op_calls"]
            1.0
        """
        data = asdict(self)
        data["ops"] = [asdict(op) for op in self.ops]
        return data

    def with_partial(self, partial: bool) -> OpSummary:
        """A copy with ``partial`` set."""
        return replace(self, partial=partial)


def summary_from_dict(data: dict[str, Any]) -> OpSummary:
    """The :class:`OpSummary` of :meth:`OpSummary.to_dict` (``summary.json``'s ``summary``).

    Example:
        >>> s = build_summary([RawOp("a", 2, 1.0, 1.0)], 2, 1, 3.0)
        >>> summary_from_dict(s.to_dict()) == s
        True
    """
    fields = dict(data)
    fields["ops"] = tuple(OpStats(**op) for op in fields.get("ops", ()))
    known = OpSummary.__dataclass_fields__
    return OpSummary(**{k: v for k, v in fields.items() if k in known})


def _share(part: float, total: float) -> float:
    return 100.0 * part / total if total > 0 else 0.0


def build_summary(
    raw_ops: list[RawOp],
    top_level_calls: int,
    steps: int,
    wall_time_us: float,
    device_label: str | None = None,
    device_rows: list[RawOp] | None = None,
    peak_allocated_bytes: dict[str, float] | None = None,
) -> OpSummary:
    """Build the per-step summary of a window from its totals.

    Args:
        raw_ops: CPU-side operator rows (window totals), profiler step markers excluded.
        top_level_calls: operator dispatches at the top of the CPU call tree (window total).
        steps: profiled steps in the window (at least 1).
        wall_time_us: wall-clock time of the window's profiled steps (total).
        device_label: the device's column label, or ``None`` for a CPU-only backend.
        device_rows: device-side rows (kernels); their self time is the device total. When
            absent, the device total is the sum of the operators' self device times.
        peak_allocated_bytes: peak allocated bytes per device in the window, if recorded.

    Returns:
        The summary. With ``device_label`` set but no device time above zero, device fields
        stay ``None`` and ``device_note`` says that device time was not captured.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    cpu_total = sum(op.self_cpu_us for op in raw_ops)
    device_total: float | None = None
    note = None
    if device_label is not None:
        measured = sum(row.self_device_us or 0.0 for row in device_rows or raw_ops)
        if measured > 0:
            device_total = measured
        else:
            note = f"{device_label} device time was not captured in this window"
    timed = device_total is not None
    ops = [
        OpStats(
            name=op.name,
            calls=op.count / steps,
            self_cpu_us=op.self_cpu_us / steps,
            cpu_total_us=op.cpu_total_us / steps,
            cpu_pct=_share(op.self_cpu_us, cpu_total),
            self_device_us=(op.self_device_us or 0.0) / steps if timed else None,
            device_total_us=(op.device_total_us or 0.0) / steps if timed else None,
            device_pct=_share(op.self_device_us or 0.0, device_total or 0.0) if timed else None,
            input_shapes=op.input_shapes,
            flops=op.flops / steps if op.flops is not None else None,
        )
        for op in raw_ops
    ]
    ops.sort(key=lambda o: (-(o.self_device_us or 0.0), -o.self_cpu_us, o.name))
    return OpSummary(
        steps=steps,
        wall_time_us=wall_time_us / steps,
        cpu_time_us=cpu_total / steps,
        device_time_us=device_total / steps if device_total is not None else None,
        op_calls=top_level_calls / steps,
        device_label=device_label,
        ops=tuple(ops),
        device_note=note,
        flops_per_step=(
            sum(op.flops or 0.0 for op in raw_ops) / steps
            if any(op.flops is not None for op in raw_ops)
            else None
        ),
        peak_allocated_bytes=dict(peak_allocated_bytes or {}),
    )
