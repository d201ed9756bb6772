"""``comparison.html``: one :class:`~neuron_mlflow.summary.comparison.Comparison` as a
self-contained page (the result, the ``--fail-above`` verdict, "How sure" as a table and a
forest plot, per-run totals and per-operator bars), under ``report.html``'s page rules
(``docs/report.md``).

Example:
    >>> from neuron_mlflow.summary.comparison import RunProfile, compare_profiles
    >>> op = lambda us: {"aten::mul": {"self_cpu_us": us}}
    >>> a = RunProfile("a1", "naive", "p", {"cpu_time_us": 125.0}, op(61.0))
    >>> b = RunProfile("b2", "fused", "p", {"cpu_time_us": 48.0}, op(9.0))
    >>> page = render_comparison_html(compare_profiles([a, b]), fail_above_pct=10.0)
    >>> "-61.6%" in page, "cannot decide" in page, 'id="nm-forest"' in page
    (True, True, True)
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from itertools import groupby, islice

from neuron_mlflow.summary.comparison import (
    HEADLINE,
    METRIC_LABELS,
    OP_FIELDS,
    SAMPLED,
    UNTIMED,
    Comparison,
    RunProfile,
    compare_profiles,
    regressions,
    render_seed_markdown,
    stat_rows,
    stat_table,
    undecided,
)
from neuron_mlflow.summary.names import display_names
from neuron_mlflow.summary.ops import OpSummary
from neuron_mlflow.summary.report import page
from neuron_mlflow.summary.statistics import (
    IMPROVEMENT,
    INSUFFICIENT,
    NO_CHANGE,
    REGRESSION,
    STATISTIC,
)
from neuron_mlflow.summary.tables import format_us

LABELS = {m: f"{METRIC_LABELS[m]} per step" for m in SAMPLED}


def _value(metric: str, value: float | None, run: RunProfile | None = None) -> str:
    """``value`` as text; ``run``: the run it belongs to (no value: was every step disturbed)."""
    if value is None:
        return UNTIMED if run is not None and run.every_step_disturbed else "-"
    return f"{value:g}" if metric == "op_calls" else format_us(value)


def _bar(
    title: str, run: str, value: float | None, scale: float, text: str, change: str, kind: str
) -> str:
    """One bar; ``scale`` is the largest value of its group (the width's 100 %)."""
    width = 100 * (value or 0.0) / scale if scale else 0.0
    detail = f"{run}: {text}" + (f" ({change} vs the baseline)" if change else "")
    data = f' data-value="{value!r}" data-group-max="{scale!r}"' if value is not None else ""
    return (
        f'<div class="cmp-bar {kind}" data-run="{html.escape(run)}" '
        f'data-title="{html.escape(title)}"'
        f' data-detail="{html.escape(detail)}"{data}><div class="muted">{html.escape(run)}</div>'
        f'<div class="num">{html.escape(text)}</div><div class="track"><div class="fill" '
        f'style="width:{min(width, 100.0):.2f}%"></div></div><div class="num">{html.escape(change)}'
        "</div><div></div></div>"
    )


def _kind(pct: float | None, is_base: bool) -> str:
    if is_base:
        return "base"
    if pct is None or abs(pct) < 0.05:
        return ""
    return "good" if pct < 0 else "bad"


def _totals(c: Comparison) -> str:
    out = ['<div class="cmp" id="nm-totals">']
    for metric in (m for m in c.headline_metrics if m in LABELS):
        values = [c.values[r.run_id].get(metric) for r in c.runs]
        scale = max((v for v in values if v is not None), default=0.0) or 1.0
        out.append(f'<div class="group" data-metric="{metric}">{LABELS[metric]}</div>')
        for r, value in zip(c.runs, values, strict=True):
            base = r.run_id == c.baseline
            pct = None if base else c.headline_change_pct[r.run_id].get(metric)
            change = "" if pct is None else f"{pct:+.1f}%"
            text, kind = _value(metric, value, r), _kind(pct, base)
            out.append(_bar(LABELS[metric], r.name, value, scale, text, change, kind))
    return "".join(out) + "</div>"


def _ops(c: Comparison) -> tuple[str, float]:
    if not c.op_rows:
        return '<p class="muted">No per-operator data in these runs.</p>', 1.0
    field = c.op_rows[0]["field"]
    top = max((v or 0.0) for row in c.op_rows for v in row["values"].values()) or 1.0
    names = display_names(row["op"] for row in c.op_rows)
    out = [
        '<div class="toolbar"><button id="nm-scale">Scale: per operator</button>'
        '<button id="nm-reset">Reset zoom</button>'
        '<span id="nm-range" class="muted"></span></div><div class="cmp" id="nm-op-chart">'
    ]
    for row in c.op_rows:
        op = row["op"]
        group = max((v or 0.0) for v in row["values"].values()) or 1.0
        out.append(
            f'<div class="group" data-op="{html.escape(op)}" title="{html.escape(op)}">'
            f"{html.escape(names[op])}</div>"
        )
        for r in c.runs:
            value = row["values"].get(r.run_id)
            status = row["status"].get(r.run_id, "")
            pct = row["delta_pct"].get(r.run_id)
            if status:
                change, kind = f"[{status}]", "bad" if status == "new" else "good"
            else:
                change = "" if pct is None else f"{pct:+.1f}%"
                kind = _kind(pct, r.run_id == c.baseline)
            text = _value(field, value, None if status else r)
            out.append(_bar(op, r.name, value, group, text, change, kind))
    return "".join(out) + "</div>", top


VERDICT_COLOURS = {
    REGRESSION: "#c62828",
    IMPROVEMENT: "#1a7f37",
    NO_CHANGE: "#57606a",
    INSUFFICIENT: "#b26a00",
}
FOREST_OPS = 12
"""Op rows the forest plot draws per candidate (the top ops of the comparison)."""


def _forest(c: Comparison) -> str:
    """An inline SVG forest plot: one row per interval, log-scale ratio axis."""
    rows = [r for r in stat_rows(c) if r["estimate"] is not None and r["estimate"].low]
    heads = [r for r in rows if not r["what"].startswith("op ")]
    ops = groupby((r for r in rows if r["what"].startswith("op ")), key=lambda r: id(r["run"]))
    rows = heads + [r for _, run_ops in ops for r in islice(run_ops, FOREST_OPS)]
    if not rows:
        return '<p class="muted" id="nm-forest">No intervals: too few samples on a side.</p>'
    m = c.margin_pct / 100
    lo = min([r["estimate"].low for r in rows] + [1 / (1 + m)]) * 0.9
    hi = max([r["estimate"].high for r in rows] + [1 + m]) * 1.1
    width, left, right, row_h, top = 760, 300, 20, 22, 24
    span = math.log(hi) - math.log(lo)

    def x(v: float) -> float:
        return left + (width - left - right) * (math.log(max(v, 1e-12)) - math.log(lo)) / span

    height = top + row_h * len(rows) + 10
    out = [
        f'<svg id="nm-forest" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="intervals of the ratios">',
        f'<rect x="{x(1 / (1 + m)):.1f}" y="{top - 6}" width="{x(1 + m) - x(1 / (1 + m)):.1f}" '
        f'height="{row_h * len(rows) + 6}" fill="#eef1f4"/>',
        f'<line x1="{x(1):.1f}" x2="{x(1):.1f}" y1="{top - 6}" y2="{height - 4}" '
        'stroke="#57606a"/>',
    ]
    out += [
        f'<text x="{x(v):.1f}" y="12" font-size="10" text-anchor="middle">{v:.2f}x</text>'
        for v in (lo / 0.9, 1 / (1 + m), 1.0, 1 + m, hi / 1.1)
    ]
    for i, r in enumerate(rows):
        e = r["estimate"]
        y = top + row_h * i + row_h / 2
        colour = VERDICT_COLOURS.get(e.verdict, "#57606a")
        label = f"{r['run'].name}: {r['what']}"
        label = label if len(label) <= 48 else label[:47] + "\u2026"
        tip = f"{r['run'].name}: {r['what']}: {e.interval_text()}, {e.verdict}"
        out.append(
            f'<g class="nm-forest-row" data-what="{html.escape(r["what"])}" '
            f'data-run="{html.escape(r["run"].name)}" data-verdict="{e.verdict}">'
            f"<title>{html.escape(tip)}</title>"
            f'<text x="4" y="{y + 4:.1f}" font-size="11">{html.escape(label)}</text>'
            f'<line x1="{x(e.low):.1f}" x2="{x(e.high):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{colour}" stroke-width="3"/>'
            f'<circle cx="{x(e.ratio):.1f}" cy="{y:.1f}" r="4" fill="{colour}"/></g>'
        )
    return "".join(out) + "</svg>"


def _how_sure(c: Comparison) -> str:
    _, rows = stat_table(c)
    if not rows:
        return ""
    cells = []
    for what, run, _, _, interval, verdict, steps in rows:
        colour = VERDICT_COLOURS.get(verdict, "#57606a")
        cells.append(
            f'<tr data-verdict="{html.escape(verdict)}"><td>{html.escape(what)}</td>'
            f"<td>{html.escape(run)}</td><td>{html.escape(interval)}</td>"
            f'<td style="color:{colour}"><b>{html.escape(verdict)}</b></td>'
            f"<td>{steps}</td></tr>"
        )
    return (
        "<h2>How sure: ratio to the baseline, interval, verdict</h2>"
        f'<p class="muted">Candidate / baseline of the {STATISTIC} (undisturbed steps); 95% '
        "intervals (ops: "
        f"{100 * c.op_confidence:.2f}%, Bonferroni) from a bootstrap over runs, windows and "
        f"steps; verdicts at +-{c.margin_pct:g}% (the shaded band).</p>"
        f"{_forest(c)}"
        '<table id="nm-stats"><thead><tr><th>metric</th><th>candidate</th><th>ratio '
        "[interval]</th><th>verdict</th><th>steps (baseline/candidate)</th></tr></thead>"
        f"<tbody>{''.join(cells)}</tbody></table>"
    )


def render_comparison_html(
    comparison: Comparison, fail_above_pct: float | None = None, title: str = "Comparison"
) -> str:
    """``comparison.html``, with the verdict of ``--fail-above fail_above_pct`` when given."""
    c = comparison
    base = next(r for r in c.runs if r.run_id == c.baseline)
    runs = " · ".join(
        f"{r.name} ({r.run_id[:8]}{', ' + r.backend if r.backend else ''})" for r in c.runs
    )
    verdict = ""
    if fail_above_pct is not None:
        limit = f"--fail-above {fail_above_pct:g}%"
        if failures := regressions(c, fail_above_pct):
            items = "".join(f"<div>regression: {html.escape(line)}</div>" for line in failures)
            verdict = f'<div class="verdict fail" id="nm-verdict">Fails {limit}{items}</div>'
        elif unsure := undecided(c, fail_above_pct):
            items = "".join(f"<div>{html.escape(line)}</div>" for line in unsure)
            verdict = (
                '<div class="verdict insufficient" id="nm-verdict" style="background:#fff4e5;'
                f'color:#b26a00">The gate cannot decide at {limit}: insufficient data{items}</div>'
            )
        else:
            verdict = (
                f'<div class="verdict pass" id="nm-verdict">The gate passes: no run\'s '
                f"{c.time_metric} interval reaches above {1 + fail_above_pct / 100:.2f}x the "
                "baseline's.</div>"
            )
    notes = "".join(f'<div class="note">{html.escape(n)}</div>' for n in c.notes)
    ops_html, top = _ops(c)
    field = c.op_rows[0]["field"] if c.op_rows else ""
    outcome = ""
    if c.outcome is not None:
        outcome = (
            f'<div class="note" id="nm-result"><b>{html.escape(c.outcome.result)}</b> '
            f"({html.escape(c.statistic)})<br>{html.escape(c.outcome.detail)}</div>"
        )
    legend = (
        '<div class="legend"><span style="--c:#2167d1">baseline</span>'
        '<span style="--c:#1a7f37">lower than the baseline</span><span style="--c:#c62828">'
        "higher</span></div>"
    )
    body = (
        f'<h1>{html.escape(title)}</h1><div class="header" id="nm-header">'
        f"<div><b>runs</b>{html.escape(runs)}</div><div><b>baseline</b>{html.escape(base.name)}"
        f"</div><div><b>headline time</b>{html.escape(c.time_metric)}</div>"
        f"<div><b>values</b>{html.escape(STATISTIC)} of the undisturbed steps</div></div>"
        f"{outcome}{verdict}{notes}"
        f"{_how_sure(c)}"
        f"<h2>Per run ({html.escape(STATISTIC)})</h2>{legend}{_totals(c)}"
        f"<h2>Per operator ({html.escape(field)}, {html.escape(STATISTIC)})</h2>{ops_html}"
    )
    return page(title, body, {"op_max": top}, ("comparison.js",))


def comparison_report(
    runs: Mapping[str, tuple[str, OpSummary]],
    baseline: str | None = None,
    fail_above_pct: float | None = None,
    title: str = "Comparison",
    top: int = 20,
) -> tuple[str, str]:
    """``comparison.md`` and ``comparison.html`` for windows in hand (no MLflow read).

    Args:
        runs: display name -> (run id, that run's window summary), baseline first.
        baseline: the baseline's run id (default: the first).
        fail_above_pct: show the ``--fail-above`` verdict for this limit.
        title: the page's heading.
        top: operators shown.

    Returns:
        The Markdown (the seed's side-by-side table, then the changes) and the page.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> naive = build_summary([RawOp("aten::mul", 3, 60.9, 60.9)], 6, 1, 200.0)
        >>> fused = build_summary([RawOp("aten::_fused_rms_norm", 1, 47.6, 47.6)], 1, 1, 90.0)
        >>> md, page = comparison_report({"naive": ("r1", naive), "rms_norm": ("r2", fused)})
        >>> md.splitlines()[7]
        '| rms_norm | n/a | 47.6 | 1 | 90.0 | 0.78x [no interval] | insufficient data |'
    """
    profiles = []
    for name, (run_id, s) in runs.items():
        headline = {m: float(v) for m in HEADLINE if (v := getattr(s, m)) is not None}
        ops = {
            op.name: {f: v for f in OP_FIELDS if (v := getattr(op, f)) is not None} for op in s.ops
        }
        profiles.append(RunProfile(run_id, name, "profile", headline, ops))
    comparison = compare_profiles(profiles, baseline=baseline, top=top)
    page = render_comparison_html(comparison, fail_above_pct=fail_above_pct, title=title)
    return render_seed_markdown(comparison), page
