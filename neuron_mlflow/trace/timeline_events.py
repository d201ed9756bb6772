"""What the timeline's one pass over a trace collects: typed columns, names, lanes, steps.

Example:
    >>> p = TimelinePass()
    >>> p.event({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1,
    ...          "ts": 5, "dur": 2, "args": {"Input Dims": [[4]], "Input type": ["float"]}})
    >>> p.names, p.shapes, list(p.ops.start)
    (['aten::mul'], ['float[4]'], [5.0])
"""

from __future__ import annotations

from array import array
from typing import Any

from neuron_mlflow.naming import STEP_MARKER_PREFIX
from neuron_mlflow.trace.totals import DEVICE_CATEGORIES, OP_CATEGORIES, RUNTIME_CATEGORIES

MAX_SHAPE_CHARS = 240
OP, DEVICE = 0, 1


class EventColumns:
    """Compact per-event columns filled by the pass."""

    def __init__(self) -> None:
        self.lane, self.name, self.shape, self.corr = array("i"), array("i"), array("i"), array("q")
        self.start, self.dur = array("d"), array("d")

    def add(self, lane: int, start: float, dur: float, name: int, shape: int, corr: int) -> None:
        self.lane.append(lane)
        self.start.append(start)
        self.dur.append(dur)
        self.name.append(name)
        self.shape.append(shape)
        self.corr.append(corr)


def shape_text(args: dict[str, Any]) -> str | None:
    """``float[4, 8], Scalar`` from an event's ``Input Dims`` / ``Input type``."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list) or not dims:
        return None
    types = args.get("Input type")
    types = types if isinstance(types, list) else []
    parts = []
    for i, dim in enumerate(dims):
        kind = str(types[i]) if i < len(types) and types[i] else ""
        parts.append(f"{kind}{list(dim)}" if isinstance(dim, list) and dim else kind or "-")
    text = ", ".join(parts)
    return text if len(text) <= MAX_SHAPE_CHARS else text[: MAX_SHAPE_CHARS - 3] + "..."


def _intern(table: list[str], ids: dict[str, int], text: str) -> int:
    index = ids.get(text)
    if index is None:
        index = ids[text] = len(table)
        table.append(text)
    return index


class TimelinePass:
    """What one pass over the events collects."""

    def __init__(self) -> None:
        self.ops, self.devices = EventColumns(), EventColumns()
        self.runtime_lane, self.runtime_ts, self.runtime_corr = array("i"), array("d"), array("q")
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.shapes: list[str] = []
        self.shape_ids: dict[str, int] = {}
        self.lanes: dict[tuple[str, Any, Any], int] = {}  # (kind, pid, tid) -> lane id
        self.lane_labels: dict[int, str] = {}
        self.meta: dict[tuple[str, Any, Any], str] = {}  # (what, pid, tid) -> text
        self.steps: list[tuple[int, float, float]] = []

    def name_id(self, name: str) -> int:
        return _intern(self.names, self.name_ids, name)

    def shape_id(self, args: Any) -> int:
        text = shape_text(args) if isinstance(args, dict) else None
        return -1 if text is None else _intern(self.shapes, self.shape_ids, text)

    def lane(self, kind: str, pid: Any, tid: Any, label: str = "CPU") -> int:
        key = (kind, pid, tid)
        index = self.lanes.get(key)
        if index is None:
            index = self.lanes[key] = len(self.lanes)
            self.lane_labels[index] = label
        return index

    def event(self, e: dict[str, Any]) -> None:
        ph, cat = e.get("ph"), e.get("cat", "")
        if ph == "M":
            args = e.get("args") or {}
            value = args.get("name", args.get("labels")) if isinstance(args, dict) else None
            if value is not None:
                self.meta[(str(e.get("name")), e.get("pid"), e.get("tid"))] = str(value).strip()
            return
        if ph != "X":
            return
        try:
            ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        except (TypeError, ValueError):
            return
        args = e.get("args")
        corr = args.get("correlation") if isinstance(args, dict) else None
        corr = corr if isinstance(corr, int) else -1
        name = str(e.get("name", ""))
        pid, tid = e.get("pid"), e.get("tid")
        if cat in OP_CATEGORIES:
            if name.startswith(STEP_MARKER_PREFIX):
                if cat == "user_annotation":
                    number = name.rpartition("#")[2]
                    self.steps.append((int(number) if number.isdigit() else -1, ts, dur))
                return
            lane = self.lane("cpu", pid, tid)
            self.ops.add(lane, ts, dur, self.name_id(name), self.shape_id(args), corr)
        elif cat in RUNTIME_CATEGORIES:
            if corr >= 0:
                self.runtime_lane.append(self.lane("cpu", pid, tid))
                self.runtime_ts.append(ts)
                self.runtime_corr.append(corr)
        elif cat in DEVICE_CATEGORIES:
            lane = self.lane("device", pid, tid, DEVICE_CATEGORIES[cat])
            self.devices.add(lane, ts, dur, self.name_id(name), -1, corr)

    def lane_name(self, kind: str, pid: Any, tid: Any, label: str) -> str:
        thread = self.meta.get(("thread_name", pid, tid))
        if kind == "cpu":
            return f"CPU {thread}" if thread else f"CPU thread {tid}"
        device = self.meta.get(("process_labels", pid, 0)) or f"{label} {pid}"
        return f"{device} {thread or (f'stream {tid}' if label != 'NEURON' else tid)}"
