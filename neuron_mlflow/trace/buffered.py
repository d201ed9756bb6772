"""The buffered trace pass, for files the streaming pass cannot place in order (``docs/cli.md``):
the events it reads, sorted into start order (ties: the longer first, a parent before a child
that starts with it; then file order), through the streaming pass, so both passes share one
call tree, one launch join and one busy time.

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
    (['outer', 'inner'], [7.0, 3.0], 1)
"""

from __future__ import annotations

from operator import attrgetter

from neuron_mlflow.trace.reader import TraceEvent, TraceStream
from neuron_mlflow.trace.streaming import streaming_pass
from neuron_mlflow.trace.totals import DEVICE_CATEGORIES, OP_CATEGORIES, RUNTIME_CATEGORIES, Totals

_PLACED = OP_CATEGORIES | RUNTIME_CATEGORIES | DEVICE_CATEGORIES.keys()
"""The categories of the ``X`` events the streaming pass reads (it skips any other)."""


def buffered_pass(stream: TraceStream) -> Totals:
    """Read ``stream`` keeping the events the streaming pass reads (operators, runtime calls,
    device events, ``[memory]`` instants), then place them in start order."""
    events: list[TraceEvent] = [
        event
        for event in stream
        if (event.ph == "X" and event.cat in _PLACED)
        or (event.ph == "i" and event.name == "[memory]")
    ]
    events.sort(key=attrgetter("dur"), reverse=True)  # stable: file order breaks exact ties
    events.sort(key=attrgetter("ts"))
    return streaming_pass([events])
