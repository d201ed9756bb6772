"""Read a finished ``torch.profiler`` window into plain records.

Only attributes of ``key_averages()`` and ``events()`` are read, never the printed table.
Profiler step markers (``ProfilerStep#N``) are excluded everywhere. When the front end marks
each step's own work with a :data:`CALL_MARKER_PREFIX` range (the decorator marks each call),
only operators inside those ranges are counted, so work done between calls is left out.

Example:
    >>> import torch
    >>> from torch.profiler import ProfilerActivity, profile
    >>> with profile(activities=[ProfilerActivity.CPU]) as prof:
    ...     _ = torch.ones(4) * 2
    >>> stats = read_profile(prof)
    >>> [op.name for op in stats.cpu_ops if op.name == "aten::mul"], stats.top_level_calls
    (['aten::mul'], 2)
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_mlflow.naming import CALL_MARKER_PREFIX, STEP_MARKER_PREFIX
from neuron_mlflow.summary.ops import RawOp

if TYPE_CHECKING:
    import torch.profiler

__all__ = ["CALL_MARKER_PREFIX", "STEP_MARKER_PREFIX", "CapturedStats", "read_profile"]
# Device runtime API calls (cudaDeviceSynchronize, hipLaunchKernel, ...) are not operators.
_RUNTIME_CALL = re.compile(r"^(cuda|cu|hip|nccl)[A-Z]\w*$")


@dataclass(slots=True)
class CapturedStats:
    """What one window's profiler knows, as window totals in microseconds.

    Attributes:
        cpu_ops: CPU-side ``key_averages()`` rows.
        device_rows: device-side rows (kernels), whose self time is the device total.
        top_level_calls: operator dispatches at the top of the CPU call tree.
        calls_marked: only work inside call markers was read (device time then comes from
            the operators' own device time, not from device rows).
    """

    cpu_ops: list[RawOp] = field(default_factory=list)
    device_rows: list[RawOp] = field(default_factory=list)
    top_level_calls: int = 0
    calls_marked: bool = False


def _is_marker(name: str) -> bool:
    return name.startswith(STEP_MARKER_PREFIX) or name.startswith(CALL_MARKER_PREFIX)


def _is_top_level(event: Any) -> bool:
    parent = event.cpu_parent
    return parent is None or _is_marker(parent.name)


def count_top_level_calls(events: Any) -> int:
    """Count operator dispatches at the top of the CPU call tree.

    An event counts when it runs on the CPU, is not a profiler step marker nor a device
    runtime API call, and has no parent other than a step marker.

    Example:
        >>> count_top_level_calls([])
        0
    """
    from torch.autograd import DeviceType

    count = 0
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue
        name = event.name
        if _is_marker(name) or _RUNTIME_CALL.match(name):
            continue
        if _is_top_level(event):
            count += 1
    return count


def _subtree(roots: list[Any]) -> list[Any]:
    kept: list[Any] = []
    stack = list(roots)
    while stack:
        event = stack.pop()
        kept.append(event)
        stack.extend(event.cpu_children)
    return kept


def _inside_call_markers(events: Any) -> list[Any]:
    """CPU events inside a call marker, markers excluded.

    Events nested under a marker count, and so do call trees on other threads (e.g. the
    autograd engine's device threads) whose root starts while a marker is open.
    """
    events = list(events)
    markers = [e for e in events if e.name.startswith(CALL_MARKER_PREFIX)]
    intervals = sorted((m.time_range.start, m.time_range.end) for m in markers)
    starts = [start for start, _ in intervals]
    roots = [child for m in markers for child in m.cpu_children]
    marker_threads = {m.thread for m in markers}
    for event in events:
        if event.cpu_parent is not None or event.thread in marker_threads:
            continue
        if _is_marker(event.name):
            continue
        i = bisect.bisect_right(starts, event.time_range.start) - 1
        if i >= 0 and event.time_range.start <= intervals[i][1]:
            roots.append(event)
    return _subtree(roots)


def aggregate_events(events: Any) -> list[RawOp]:
    """Group CPU events by name into window totals, like ``key_averages()`` does.

    Example:
        >>> aggregate_events([])
        []
    """
    rows: dict[str, list[float]] = {}
    for event in events:
        if _is_marker(event.name):
            continue
        row = rows.setdefault(event.name, [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += event.self_cpu_time_total
        row[2] += event.cpu_time_total
        row[3] += event.self_device_time_total
        row[4] += event.device_time_total
    return [RawOp(name, int(r[0]), r[1], r[2], r[3], r[4]) for name, r in rows.items()]


def read_profile(prof: torch.profiler.profile, calls_marked: bool = False) -> CapturedStats:
    """Read a finished profile (inside ``on_trace_ready`` or after ``stop()``).

    Args:
        prof: the profiler whose events are still held.
        calls_marked: each step's own work sits in a :data:`CALL_MARKER_PREFIX` range; count
            only what is inside (device time then comes from the operators' own kernels).

    Returns:
        Window totals: CPU op rows, device rows and the top-level call count.
    """
    from torch.autograd import DeviceType

    stats = CapturedStats()
    if calls_marked:
        inside = _inside_call_markers(prof.events())
        stats.cpu_ops = aggregate_events(inside)
        stats.top_level_calls = count_top_level_calls(inside)
        stats.calls_marked = True
        return stats
    for row in prof.key_averages():
        if row.key.startswith(STEP_MARKER_PREFIX):
            continue
        raw = RawOp(
            name=row.key,
            count=int(row.count),
            self_cpu_us=float(row.self_cpu_time_total),
            cpu_total_us=float(row.cpu_time_total),
            self_device_us=float(row.self_device_time_total),
            device_total_us=float(row.device_time_total),
        )
        if row.device_type == DeviceType.CPU:
            stats.cpu_ops.append(raw)
        else:
            stats.device_rows.append(raw)
    stats.top_level_calls = count_top_level_calls(prof.events())
    return stats
