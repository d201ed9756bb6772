"""Per-step samples of one window: ``steps.jsonl``, what ``compare`` decides from.

The format is in ``docs/comparing.md``. The steps come from the lowest rank's trace through
the timeline pass (:func:`~neuron_mlflow.trace.timeline.build_timeline`), counted by the rules
of docs/metrics.md; an operator counts in the step whose range holds the start of its call
tree's root.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "traces").mkdir()
    >>> events = []
    >>> for i, dur in enumerate((30, 10, 12)):
    ...     t = 100 * i
    ...     events += [{"ph": "X", "cat": "user_annotation", "name": "neuron_mlflow: f",
    ...                 "pid": 1, "tid": 1, "ts": t, "dur": 50},
    ...                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
    ...                 "ts": t + 1, "dur": dur}]
    >>> _ = (root / "traces" / "t.json").write_text(json.dumps({"traceEvents": events}))
    >>> stats = write_step_samples(root, root / "traces", top_k=5)
    >>> stats["step_stats"]["cpu_time_us"]
    {'p50': 12.0, 'iqr': 10.0}
    >>> [json.loads(line).get("self_cpu_us") for line in (root / "steps.jsonl").open()][:2]
    [None, 30.0]
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_mlflow.naming import (
    CALL_MARKER_PREFIX,
    STEP_INTERFERENCE_KEY,
    STEP_STATS_KEY,
    STEPS_FILE,
)
from neuron_mlflow.summary.comparison import stable_op_names
from neuron_mlflow.summary.statistics import disturbed, iqr, median
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.timeline import DEVICE, OP, build_timeline

_RANK = re.compile(r"rank_(\d+)")
HEADLINE_TIMES = ("wall_time_us", "cpu_time_us", "device_time_us")
"""Headline times kept per step (and given ``_p50`` / ``_iqr`` metrics)."""


@dataclass
class Step:
    """One step's headline times and per-op totals (``name -> [self_cpu, self_device, calls]``)."""

    start: float
    end: float
    cpu: float = 0.0
    device: float = 0.0
    top_level: int = 0
    ops: dict[str, list[float]] = field(default_factory=dict)


def lowest_rank_trace(trace_dir: Path) -> Path | None:
    """The window's trace for its steps and its report's timeline: the lowest rank's first
    ``.json``/``.json.gz`` file under ``trace_dir`` (``None`` when there is none)."""
    if not trace_dir.is_dir():
        return None

    def order(path: Path) -> tuple[int, str]:
        match = _RANK.search(str(path.relative_to(trace_dir)))
        return (int(match.group(1)) if match else 1 << 30, str(path))

    found = [
        p for p in trace_dir.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file()
    ]
    return min(found, key=order) if found else None


def read_interference(trace: Path) -> list[tuple[float | None, int | None]] | None:
    """Per recorded step ``(cpu_wait_us, involuntary_switches)`` from the trace's metadata
    (written by a live window before the events: only the file's head is read); ``None``
    when the trace does not say.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "t.json"
        >>> _ = path.write_text(json.dumps({STEP_INTERFERENCE_KEY: [[0.0, 0], [9100.5, 3]],
        ...                                 "traceEvents": []}))
        >>> read_interference(path)
        [(0.0, 0), (9100.5, 3)]
    """
    try:
        stream = TraceStream(trace)
        next(stream.batches(), None)  # the metadata before the events is read by then
        found = stream.metadata.get(STEP_INTERFERENCE_KEY)
        if isinstance(found, str):
            found = json.loads(found)
    except Exception:  # the events' own reader reports a broken trace
        return None
    if not isinstance(found, list):
        return None
    rows = [[*row, None, None][:2] if isinstance(row, list) else (None, None) for row in found]
    return [
        (
            float(wait) if isinstance(wait, int | float) else None,
            int(switches) if isinstance(switches, int) else None,
        )
        for wait, switches in rows
    ]


def mark_disturbed(steps: list[dict[str, Any]], trace: Path) -> None:
    """Give each recorded step of a timeline (``wall_us``) its ``cpu_wait_us``,
    ``involuntary_switches`` and ``disturbed`` (``report.html`` marks those)."""
    found = read_interference(trace) or []
    for step, (wait, switches) in zip(steps, found, strict=False):
        step["cpu_wait_us"], step["involuntary_switches"] = wait, switches
        step["disturbed"] = disturbed(float(step.get("wall_us") or 0.0), wait, switches)


def step_samples(
    trace: Path, recorded_steps: int | None = None
) -> tuple[list[Step], bool, list[str]]:
    """The steps of one trace (counted as the module docstring says).

    Returns:
        The steps, whether device events were seen, and the op names in first-call order.
    """
    timeline = build_timeline(trace, max_events=1 << 40)
    ev, names = timeline.events, timeline.names
    kind, start, dur = ev["kind"], ev["start_us"], ev["dur_us"]
    parent, self_us, name = ev["parent"], ev["self_us"], ev["name"]
    n = len(kind)
    marker = [kind[i] == OP and names[name[i]].startswith(CALL_MARKER_PREFIX) for i in range(n)]

    def root(i: int) -> tuple[int, bool]:
        """The outermost non-marker ancestor of ``i`` and whether a marker is above it."""
        top, marked = i, False
        j = parent[i]
        while j >= 0:
            if marker[j]:
                marked = True
            else:
                top = j
            j = parent[j]
        return top, marked

    outer = [i for i in range(n) if marker[i] and not root(i)[1]]
    if outer:
        ranges = sorted((start[i], start[i] + dur[i]) for i in outer)
    else:
        ranges = sorted((s["start_us"], s["start_us"] + s["wall_us"]) for s in timeline.steps)
        if recorded_steps is not None and 0 < recorded_steps < len(ranges):
            ranges = ranges[:recorded_steps]
        if not ranges and n:
            ranges = [(min(start), max(s + d for s, d in zip(start, dur, strict=True)))]
    steps = [Step(a, b) for a, b in ranges]
    begins = [s.start for s in steps]
    children = Counter(p for p in parent if p >= 0)

    def step_of(t: float) -> Step | None:
        at = bisect.bisect_right(begins, t)  # the last step starting at or before t, plus one
        if at == 0:
            return None
        found = steps[at - 1]
        return found if t <= found.end else None

    order: dict[str, float] = {}
    op_step: dict[int, Step] = {}
    for i in range(n):
        if kind[i] != OP or marker[i]:
            continue
        top, _ = root(i)
        step = step_of(start[top])
        if step is None:
            continue
        op_step[i] = step
        op = names[name[i]]
        order[op] = min(order.get(op, start[i]), start[i])
        row = step.ops.setdefault(op, [0.0, 0.0, 0.0])
        row[0] += self_us[i]
        step.cpu += self_us[i]
        p = parent[i]
        folded = p >= 0 and not marker[p] and name[p] == name[i] and children[p] == 1
        if not folded:
            row[2] += 1
        if p < 0 or marker[p]:
            step.top_level += 1
    has_device = any(k == DEVICE for k in kind)
    for i in range(n):
        if kind[i] != DEVICE or parent[i] not in op_step:
            continue
        step = op_step[parent[i]]
        step.device += dur[i]
        step.ops[names[name[parent[i]]]][1] += dur[i]
    first_seen = sorted(order, key=lambda op: order[op])
    return steps, has_device, first_seen


def write_step_samples(artifacts_dir: Path, trace_dir: Path, top_k: int) -> dict[str, Any]:
    """Write ``steps.jsonl`` into the window's artifact folder from its trace.

    Args:
        artifacts_dir: the window's artifact folder (its ``summary.json`` gives the top-k ops
            and the steps counted, when already written).
        trace_dir: the folder holding the window's traces (``traces/rank_<r>/...``).
        top_k: how many operators get per-step rows (the window's top ``top_k``).

    Returns:
        ``{"step_stats": {"wall_time_us": {"p50": .., "iqr": ..}, ...}}`` for the summary's
        ``extra`` (:func:`neuron_mlflow.naming.window_metrics` makes ``P/<time>_p50`` and
        ``P/<time>_iqr`` of it); ``{}`` when the window has no trace or no steps.

    Raises:
        TraceFormatError: the trace is truncated or malformed.
    """
    trace = lowest_rank_trace(trace_dir)
    if trace is None:
        return {}
    try:
        data = json.loads((artifacts_dir / "summary.json").read_text(encoding="utf-8"))
        summary = data.get("summary") or {}
    except (OSError, ValueError, AttributeError):  # not written yet, or not a summary
        summary = {}
    recorded = summary.get("steps") if isinstance(summary.get("steps"), int) else None
    steps, has_device, first_seen = step_samples(trace, recorded)
    if not steps:
        return {}
    ranked = [str(op.get("name")) for op in summary.get("ops") or [] if isinstance(op, dict)]
    if not ranked:
        totals: dict[str, float] = {}
        for step in steps:
            for op, sums in step.ops.items():
                totals[op] = totals.get(op, 0.0) + (sums[1] if has_device else sums[0])
        ranked = sorted(totals, key=lambda op: (-totals[op], op))
    top = [op for op in ranked if op in set(first_seen)][:top_k]
    keys = stable_op_names(first_seen)
    lines = []
    per_time: dict[str, list[float]] = {m: [] for m in HEADLINE_TIMES}
    interference = read_interference(trace)
    if interference is None or len(interference) != len(steps):  # says nothing of these steps
        interference = [(None, None)] * len(steps)
    for index, step in enumerate(steps):
        wall = round(step.end - step.start, 3)
        wait, switches = interference[index]
        head: dict[str, Any] = {
            "step": index,
            "wall_time_us": wall,
            "cpu_time_us": round(step.cpu, 3),
            "device_time_us": round(step.device, 3) if has_device else None,
            "op_calls": step.top_level,
            "cpu_wait_us": wait,
            "involuntary_switches": switches,
            "disturbed": disturbed(wall, wait, switches),
        }
        for metric in HEADLINE_TIMES:
            if head[metric] is not None:
                per_time[metric].append(float(head[metric]))
        lines.append(json.dumps(head, separators=(",", ":")))
        for op in top:
            cpu, device, calls = step.ops.get(op, [0.0, 0.0, 0.0])
            row: dict[str, Any] = {
                "step": index,
                "op": op,
                "key": keys[op],
                "self_cpu_us": round(cpu, 3),
                "self_device_us": round(device, 3) if has_device else None,
                "calls": calls,
            }
            lines.append(json.dumps(row, separators=(",", ":")))
    (artifacts_dir / STEPS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = {
        metric: {"p50": median(values), "iqr": iqr(values)}
        for metric, values in per_time.items()
        if values
    }
    return {STEP_STATS_KEY: stats}


def read_step_samples(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The headline rows and the op rows of a ``steps.jsonl`` text.

    Example:
        >>> read_step_samples('{"step":0,"cpu_time_us":3}\\n{"step":0,"op":"a","key":"a"}\\n')
        ([{'step': 0, 'cpu_time_us': 3}], [{'step': 0, 'op': 'a', 'key': 'a'}])
    """
    heads: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            (ops if "op" in row else heads).append(row)
    return heads, ops
