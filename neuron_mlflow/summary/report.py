"""``report.html``: one window's profile as a self-contained, interactive page.

Every byte the page needs is inside it (MLflow's sandboxed artifact viewer): the JavaScript
and CSS of ``assets/`` inline, the data as JSON in a ``<script type="application/json">``
block. What it shows and how it fits its budget: docs/report.md.

Example:
    >>> from neuron_mlflow.summary.ops import RawOp, build_summary
    >>> s = build_summary([RawOp("aten::mul", 3, 60.9, 60.9, 1164.5, 1164.5)], 3, 1, 2000.0,
    ...                   device_label="NEURON")
    >>> page = render_report(s, {"backend": "neuron", "window": "steps 3-7"})
    >>> page.startswith("<!DOCTYPE html>"), format_us(1164.5) in page, "http" in page
    (True, True, False)
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from neuron_mlflow.summary.names import display_names
from neuron_mlflow.summary.ops import OpSummary
from neuron_mlflow.summary.tables import format_us
from neuron_mlflow.summary.verdict import verdict_lines

BUDGET_BYTES = 10_000_000
"""Size budget of one report (MLflow's viewer previews files up to 50 MiB)."""
TOP_OPS = 200
"""Operators listed as bars (``summary.md`` and ``ops.csv`` list every one)."""
VISIBLE_OPS = 25
"""Of those, shown before a "more" toggle."""


def embed_json(data: Any) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element (no ``<``, U+2028/9).

    Example:
        >>> embed_json({"name": "</script>"})
        '{"name":"\\\\u003c/script>"}'
    """
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page(title: str, body: str, data: Any, scripts: tuple[str, ...]) -> str:
    """A whole self-contained page: inline CSS, the data block, inline scripts."""
    assets = resources.files("neuron_mlflow.summary").joinpath("assets")
    css = assets.joinpath("report.css").read_text("utf-8")
    code = "\n".join(assets.joinpath(name).read_text("utf-8") for name in ("common.js", *scripts))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{css}</style>\n"
        f'</head><body>\n{body}\n<div id="nm-tip"></div>\n'
        f'<script type="application/json" id="nm-data">{embed_json(data)}</script>\n'
        f"<script>\n{code}\n</script>\n</body></html>\n"
    )


def _header(header: Mapping[str, Any]) -> str:
    items = "".join(
        f"<div><b>{html.escape(str(k))}</b>{html.escape(str(v))}</div>"
        for k, v in header.items()
        if v not in (None, "")
    )
    return f'<div class="header" id="nm-header">{items}</div>'


def _totals(s: Mapping[str, Any]) -> str:
    label = s.get("device_label")
    parts = [f"Per profiled step, over {s['steps']} step(s):"]
    parts.append(f"self CPU time {format_us(s['cpu_time_us'])}")
    if s.get("device_time_us") is not None:
        parts.append(f"self {label} time {format_us(s['device_time_us'])}")
    elif s.get("device_note"):
        parts.append(str(s["device_note"]))
    parts.append(f"wall time {format_us(s['wall_time_us'])}")
    aten = sum(op["calls"] for op in s.get("ops") or [] if op["name"].startswith("aten::"))
    parts.append(f"aten ops dispatched {aten:g}")
    parts.append(f"top-level calls {s['op_calls']:g}")
    if s.get("partial"):
        parts.append("partial window (it ended before its last scheduled step)")
    parts.extend(line[2:] for line in verdict_lines(s.get("extra") or {}))  # Neuron verdict
    return f'<p id="nm-totals">{html.escape(" · ".join(parts))}</p>'


def _top_ops(s: Mapping[str, Any]) -> str:
    """The ``summary.md`` table as bars: the same rows, columns and formatting."""
    ops = list(s.get("ops") or [])
    device = s.get("device_time_us") is not None
    label = s.get("device_label")
    if not ops:
        return '<p class="muted">No operators were recorded in this window.</p>'
    shown = ops[:TOP_OPS]
    names = display_names(op["name"] for op in shown)
    value_key = "self_device_us" if device else "self_cpu_us"
    share_key = "device_pct" if device else "cpu_pct"
    top = max((op[value_key] or 0.0) for op in shown) or 1.0
    heads = (
        [f"Self {label}", "Calls", "Self CPU", f"{label} %"]
        if device
        else ["Self CPU", "Calls", "CPU %", ""]
    )
    out = ['<div class="bars" id="nm-ops"><div class="head">Name</div><div></div>']
    out += [f'<div class="head num">{html.escape(h)}</div>' for h in heads]
    for at, op in enumerate(shown):
        if at == VISIBLE_OPS:
            out.append(f'<details class="more"><summary>{len(shown) - at} more</summary>')
        value = op[value_key] or 0.0
        share = f"{op[share_key] or 0.0:.1f} %"
        cells = [format_us(value), f"{op['calls']:g}"]
        cells += [format_us(op["self_cpu_us"]), share] if device else [share, ""]
        detail = f"{cells[0]} per step, {cells[1]} call(s) per step, {share} of the window"
        out.append(
            f'<div class="op-row" data-name="{html.escape(op["name"])}" data-value="{value!r}" '
            f'data-detail="{html.escape(detail)}">'
            f'<div class="name">{html.escape(names[op["name"]])}</div>'
            f'<div class="track"><div class="fill" style="width:{100 * value / top:.2f}%"></div>'
            "</div>" + "".join(f'<div class="num">{html.escape(c)}</div>' for c in cells) + "</div>"
        )
    out.append("</details></div>" if len(shown) > VISIBLE_OPS else "</div>")
    if len(ops) > len(shown):
        out.append(f'<p class="muted">{len(ops) - len(shown)} more operator(s) in summary.md.</p>')
    return "".join(out)


def _steps(steps: list[Mapping[str, Any]]) -> str:
    if not steps:
        return '<p class="muted">The trace has no ProfilerStep markers.</p>'
    top = max(max(st["wall_us"], st.get("device_us") or 0.0) for st in steps) or 1.0
    device = any(st.get("device_us") is not None for st in steps)
    legend = '<span style="--c:#2167d1">wall time</span>'
    if device:
        legend += (
            '<span style="--c:#e07b00">device time</span>'
            '<span style="--c:#1a7f37">device busy share</span>'
        )
    out = [f'<div class="legend">{legend}</div><div class="steps" id="nm-steps">']
    renamed = [st for st in steps if st.get("trace_step", st["step"]) != st["step"]]
    if renamed:  # the name to look for in Perfetto; the page keeps the window's numbers
        first, last = renamed[0], renamed[-1]
        out.insert(
            0,
            f'<p class="muted" id="nm-trace-steps">Steps {first["step"]}-{last["step"]} are '
            f"ProfilerStep#{first['trace_step']}-#{last['trace_step']} in the trace file "
            "(torch.profiler counts from its own start).</p>",
        )
    marked = [st for st in steps if st.get("disturbed")]
    if marked:
        out.insert(
            0,
            f'<p class="note" id="nm-disturbed">{len(marked)} of {len(steps)} steps disturbed by '
            "other processes (marked \u26a0: this process's threads waited for a CPU at least "
            "5 % of the step, or, where the wait is unknown, lost a CPU to another process); "
            "comparisons leave them out.</p>",
        )
    for st in steps:
        bars = [("", st["wall_us"] / top, format_us(st["wall_us"]))]
        if st.get("device_us") is not None:
            bars.append(("device", st["device_us"] / top, format_us(st["device_us"])))
            busy = st.get("device_busy_pct") or 0.0
            bars.append(("busy", busy / 100.0, f"{busy:.1f} %"))
        label = f"step {st['step']}"
        if st.get("disturbed"):
            waited = st.get("cpu_wait_us")
            why = f"waited {format_us(waited)} for a CPU" if waited else "preempted"
            label = (
                f'<span class="nm-disturbed" title="disturbed by other processes: {why}">'
                f"{label} \u26a0</span>"
            )
        for i, (cls, frac, text) in enumerate(bars):
            out.append(f'<div class="muted">{label if i == 0 else ""}</div>')
            out.append(
                f'<div class="track"><div class="fill {cls}" style="width:'
                f'{100 * min(frac, 1.0):.2f}%"></div></div><div class="num">{text}</div>'
            )
    return "".join(out) + "</div>"


def _timeline_section(t: Mapping[str, Any] | None) -> str:
    if not t or not t.get("events", {}).get("dur_us"):
        return '<p class="muted">No trace events in this window: no timeline.</p>'
    kept = len(t["events"]["dur_us"])
    note = ""
    if t.get("left_out"):
        note = (
            f'<div class="note" id="nm-left-out">Showing the {kept:,} longest of '
            f"{t['total_events']:,} events; {t['left_out']:,} shorter ones left out "
            "(the full trace is in traces/).</div>"
        )
    return (
        '<div class="toolbar"><button id="nm-reset">Reset zoom</button>'
        '<span id="nm-range" class="muted"></span><span id="nm-selection"></span></div>'
        f'{note}<div class="muted">Wheel: zoom · drag: pan · hover: details · click: select an '
        'operator and all its calls</div><div id="nm-canvas-box"><canvas id="nm-canvas">'
        "</canvas></div>"
    )


def _trim(t: Mapping[str, Any], count: int) -> dict[str, Any]:
    """The timeline with only its ``count`` longest bars (the events come longest first)."""
    events = {key: list(values[:count]) for key, values in t["events"].items()}
    events["parent"] = [p if p < count else -1 for p in events["parent"]]
    dropped = len(t["events"]["dur_us"]) - len(events["dur_us"])
    out = {**t, "events": events, "left_out": t.get("left_out", 0) + dropped}
    for table, columns in (("names", ("name", "launcher")), ("shapes", ("shape",))):
        used = sorted({i for c in columns for i in events[c] if i >= 0})  # drop unused entries
        new = {old: at for at, old in enumerate(used)}
        for c in columns:
            events[c] = [new[i] if i >= 0 else -1 for i in events[c]]
        out[table] = [t[table][i] for i in used]
        if table == "names" and "short" in t:
            out["short"] = [t["short"][i] for i in used]
    return out


def render_report(
    summary: OpSummary,
    header: Mapping[str, Any],
    timeline: Mapping[str, Any] | None = None,
    budget_bytes: int = BUDGET_BYTES,
) -> str:
    """One window's ``report.html``.

    Args:
        header: label to value, shown in order (backend, device, window, run, versions...).
        timeline: :meth:`Timeline.to_dict() <neuron_mlflow.trace.timeline.Timeline.to_dict>`
            of the window's trace, or ``None`` (no timeline section then).
        budget_bytes: the page's size budget; the timeline drops its shortest bars to fit.
    """
    s = summary.to_dict()
    t = dict(timeline) if timeline else None
    if t is not None:
        shown = display_names(t["names"])
        t["short"] = [shown[name] for name in t["names"]]
    for _ in range(4):
        text = _render(s, header, t)
        size = len(text.encode("utf-8"))
        if size <= budget_bytes or t is None or not t["events"]["dur_us"]:
            return text
        bars = len(t["events"]["dur_us"])
        fixed = len(_render(s, header, _trim(t, 0)).encode("utf-8"))
        per_bar = max((size - fixed) / bars, 1.0)
        t = _trim(t, max(int((budget_bytes - fixed) / per_bar * 0.95), 0))
    return text


def _render(s: Mapping[str, Any], header: Mapping[str, Any], t: Mapping[str, Any] | None) -> str:
    window = header.get("window", "")
    body = (
        f"<h1>Profile window {html.escape(str(window))}</h1>{_header(header)}{_totals(s)}"
        f"<h2>Timeline</h2>{_timeline_section(t)}"
        f"<h2>Top operators (per step)</h2>{_top_ops(s)}"
        f"<h2>Profiled steps</h2>{_steps(list(t['steps']) if t else [])}"
    )
    return page(f"neuron-mlflow report {window}", body, {"timeline": t}, ("report.js",))
