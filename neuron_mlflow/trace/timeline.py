"""The timeline of one trace file, as plain data for the window's ``report.html``.

One streamed pass (:class:`~neuron_mlflow.trace.reader.TraceStream`) collects every
operator, runtime call and device event in compact typed arrays; what the timeline shows
and which bars it keeps: docs/report.md. Times are microseconds from the first event
(``origin_us``).

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps({"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1,
    ...      "ts": 100, "dur": 10, "args": {"Input Dims": [[4, 8], []],
    ...                                     "Input type": ["float", "Scalar"]}},
    ...     {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
    ...      "ts": 102, "dur": 3, "args": {"correlation": 7}},
    ...     {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7,
    ...      "ts": 120, "dur": 40, "args": {"correlation": 7}}]}))
    >>> timeline = build_timeline(path)
    >>> [lane["name"] for lane in timeline.lanes]
    ['CPU thread 1', 'CUDA 0 stream 7']
    >>> [timeline.names[i] for i in timeline.events["name"]], timeline.events["parent"]
    (['mul_kernel', 'aten::mul'], [1, -1])
    >>> timeline.names[timeline.events["launcher"][0]], timeline.events["self_us"]
    ('aten::mul', [-1, 10.0])
    >>> timeline.shapes
    ['float[4, 8], Scalar']
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from neuron_mlflow.naming import STEP_MARKER_PREFIX
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.totals import DEVICE_CATEGORIES, OP_CATEGORIES, RUNTIME_CATEGORIES

MAX_EVENTS = 120_000
"""Bars kept by default: about 5 MB of report, and a timeline that stays fluid."""
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


@dataclass
class Timeline:
    """Plain timeline data of one trace (see the module docstring).

    Attributes:
        lanes: ``{"name", "kind": "cpu"|"device", "label"}`` per lane, CPU lanes first.
        steps: ``{"step", "trace_step", "start_us", "wall_us", "device_us",
            "device_busy_pct"}`` per ``ProfilerStep#N`` (device fields ``None`` without device
            events). ``trace_step`` is ``N``, torch.profiler's own count; ``step`` is ``N``
            too until :func:`~neuron_mlflow.trace.window_report.write_window_report` gives the
            steps the window's own numbers.
        names: every event name, by id.
        shapes: input-shape strings, by id.
        events: columns of the kept bars, longest first: ``kind`` (0 operator, 1 device),
            ``lane``, ``start_us``, ``dur_us``, ``name``, ``depth``, ``self_us`` (operators;
            -1 for device events), ``shape`` (-1 when none), ``launcher`` (name id of the
            operator that launched a device event, -1 when unknown) and ``parent`` (index of
            the kept bar of that operator, or of an operator's parent; -1 when none).
        origin_us: trace time of ``start_us == 0``.
        span_us: from the first event's start to the last event's end.
        total_events: operators and device events in the trace.
        left_out: of those, how many the budget left out.
    """

    lanes: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    events: dict[str, list[Any]] = field(default_factory=dict)
    origin_us: float = 0.0
    span_us: float = 0.0
    total_events: int = 0
    left_out: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (what :func:`neuron_mlflow.summary.report.render_report` reads)."""
        return asdict(self)


def _tree(
    columns: EventColumns, lanes: int
) -> tuple[list[int], list[float], list[int], list[list[int]]]:
    """Depth, self time and parent of every event, and each lane's events in start order."""
    n = len(columns.start)
    depth, parent = [0] * n, [-1] * n
    self_time = list(columns.dur)
    by_lane: list[list[int]] = [[] for _ in range(lanes)]
    for i, lane in enumerate(columns.lane):
        by_lane[lane].append(i)
    start, dur = columns.start, columns.dur
    for order in by_lane:
        order.sort(key=lambda i: (start[i], -dur[i]))
        stack: list[int] = []
        for i in order:
            while stack and start[stack[-1]] + dur[stack[-1]] <= start[i]:
                stack.pop()
            if stack:
                parent[i] = stack[-1]
                self_time[stack[-1]] -= dur[i]
            depth[i] = len(stack)
            stack.append(i)
    return depth, self_time, parent, by_lane


def _launchers(p: TimelinePass, op_parent: list[int], by_lane: list[list[int]]) -> dict[int, int]:
    """Correlation id -> the innermost operator around its runtime call."""
    starts = [[p.ops.start[i] for i in order] for order in by_lane]
    out: dict[int, int] = {}
    for lane, ts, corr in zip(p.runtime_lane, p.runtime_ts, p.runtime_corr, strict=True):
        at = bisect.bisect_right(starts[lane], ts) - 1
        op = by_lane[lane][at] if at >= 0 else -1
        while op >= 0 and p.ops.start[op] + p.ops.dur[op] < ts:
            op = op_parent[op]
        if op >= 0:
            out[corr] = op
    return out


def _steps(p: TimelinePass, launch_ts: dict[int, float]) -> list[dict[str, Any]]:
    """Wall time, device time and device busy share of each profiled step."""
    steps = sorted(p.steps, key=lambda s: s[1])
    ends = [start for _, start, _ in steps[1:]] + [float("inf")]
    per_step: list[list[tuple[float, float]]] = [[] for _ in steps]
    begins = [start for _, start, _ in steps]
    for start, dur, corr in zip(p.devices.start, p.devices.dur, p.devices.corr, strict=True):
        ts = launch_ts.get(corr)
        at = bisect.bisect_right(begins, ts) - 1 if ts is not None else -1
        if at >= 0 and ts is not None and ts < ends[at]:
            per_step[at].append((start, start + dur))
    has_device = len(p.devices.start) > 0
    out = []
    for (number, start, wall), intervals in zip(steps, per_step, strict=True):
        busy, reach = 0.0, float("-inf")
        for a, b in sorted(intervals):
            if b > reach:
                busy += b - max(a, reach)
                reach = b
        out.append(
            {
                "step": number,
                "trace_step": number,
                "start_us": start,
                "wall_us": wall,
                "device_us": sum(b - a for a, b in intervals) if has_device else None,
                "device_busy_pct": min(100.0, 100.0 * busy / wall) if has_device and wall else None,
            }
        )
    return out


def build_timeline(path: str | Path, max_events: int = MAX_EVENTS) -> Timeline:
    """Read one trace file into a :class:`Timeline` of at most ``max_events`` bars.

    Args:
        path: a ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        max_events: bars kept (the longest operators and device events).

    Raises:
        TraceFormatError: the file is truncated or malformed.
    """
    p = TimelinePass()
    for event in TraceStream(path):
        p.event(event)
    ops, devices = p.ops, p.devices
    depth, self_time, parent, by_lane = _tree(ops, len(p.lanes))
    dev_depth, _, _, _ = _tree(devices, len(p.lanes))
    launcher = _launchers(p, parent, by_lane)
    launch_ts = dict(zip(p.runtime_corr, p.runtime_ts, strict=True))
    n_ops, n_dev = len(ops.start), len(devices.start)
    every = itertools.chain(
        ((ops.dur[i], -ops.start[i], OP, i) for i in range(n_ops)),
        ((devices.dur[i], -devices.start[i], DEVICE, i) for i in range(n_dev)),
    )
    kept = heapq.nlargest(max(max_events, 0), every)  # longest first; ties: earlier first
    position = {(kind, i): at for at, (_, _, kind, i) in enumerate(kept)}
    starts = [min(c, default=math.inf) for c in (ops.start, devices.start)]
    starts.append(min((s for _, s, _ in p.steps), default=math.inf))
    ends = [
        max((a + b for a, b in zip(c.start, c.dur, strict=True)), default=-math.inf)
        for c in (ops, devices)
    ]
    origin = min(starts) if min(starts) < math.inf else 0.0
    keys = ("kind", "lane", "start_us", "dur_us", "name", "depth", "self_us", "shape")
    events: dict[str, list[Any]] = {key: [] for key in (*keys, "launcher", "parent")}
    for _, _, kind, i in kept:
        columns = ops if kind == OP else devices
        events["kind"].append(kind)
        events["lane"].append(columns.lane[i])
        events["start_us"].append(round(columns.start[i] - origin, 3))
        events["dur_us"].append(round(columns.dur[i], 3))
        events["name"].append(columns.name[i])
        if kind == OP:
            events["depth"].append(depth[i])
            events["self_us"].append(round(max(self_time[i], 0.0), 3))
            events["shape"].append(ops.shape[i])
            events["launcher"].append(-1)
            events["parent"].append(position.get((OP, parent[i]), -1))
        else:
            op = launcher.get(devices.corr[i], -1)
            events["depth"].append(dev_depth[i])
            events["self_us"].append(-1)
            events["shape"].append(-1)
            events["launcher"].append(ops.name[op] if op >= 0 else -1)
            events["parent"].append(position.get((OP, op), -1) if op >= 0 else -1)
    # CPU lanes first, each process's main thread (tid == pid) first; then device lanes
    used = set(events["lane"])  # a thread with runtime calls only has no lane
    lanes = sorted(
        ((key, index) for key, index in p.lanes.items() if index in used),
        key=lambda kv: (kv[0][0] != "cpu", kv[0][0] == "cpu" and kv[0][1] != kv[0][2], kv[1]),
    )
    renumber = {index: new for new, (_, index) in enumerate(lanes)}
    events["lane"] = [renumber[lane] for lane in events["lane"]]
    steps = _steps(p, launch_ts)
    for step in steps:
        step["start_us"] = round(step["start_us"] - origin, 3)
    return Timeline(
        lanes=[
            {
                "name": p.lane_name(kind, pid, tid, p.lane_labels[index]),
                "kind": kind,
                "label": p.lane_labels[index],
            }
            for (kind, pid, tid), index in lanes
        ],
        steps=steps,
        names=p.names,
        shapes=p.shapes,
        events=events,
        origin_us=origin,
        span_us=max(max(ends) - origin, 0.0),
        total_events=n_ops + n_dev,
        left_out=n_ops + n_dev - len(kept),
    )
