"""What one trace event is to the passes: a marked range, an operator (one id per input
signature when shapes are recorded) or a ``[memory]`` instant.

Shared by both passes (:mod:`neuron_mlflow.trace.streaming`, :mod:`neuron_mlflow.trace.buffered`).

Example:
    >>> from neuron_mlflow.trace.reader import TraceEvent
    >>> totals = Totals()
    >>> op_id(totals, TraceEvent(ph="X", cat="cpu_op", name="aten::mul")), totals.names
    (0, ['aten::mul'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_mlflow.errors import OutOfOrder
from neuron_mlflow.trace.totals import Totals

if TYPE_CHECKING:
    from neuron_mlflow.trace.replay import Thread


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


def op_id(totals: Totals, event: Any) -> int:
    """The name id of an operator event (one per input signature when shapes are recorded)."""
    args = event.args
    if args is not None and args.input_dims:
        return totals.variant_id(event.name, bytes(args.input_dims), bytes(args.concrete_inputs))
    return totals.name_id(event.name)


def runtime_call(totals: Totals, event: Any) -> tuple[float, float, int, int, int]:
    """A runtime call as a thread's pending entry: ``(ts, dur, name id, correlation,
    External id)``, -1 where the trace has no correlation or id."""
    args, index = event.args, totals.name_id(event.name)
    if args is None:
        return (event.ts, event.dur, index, -1, -1)
    correlation = -1 if args.correlation is None else args.correlation
    return (event.ts, event.dur, index, correlation, args.operator_id())


def other_event(totals: Totals, event: Any) -> None:
    """A non-``X`` event: ``[memory]`` instants feed the peak memory."""
    if event.ph == "i" and event.name == "[memory]":
        args = event.args
        if args is not None and args.total_allocated is not None and args.device_type is not None:
            totals.memory_event(event.pid, event.ts, args.device_type, args.total_allocated)
