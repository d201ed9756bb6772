"""Compare profiled runs: headline metrics side by side and per-op changes against a baseline.

Pure functions over :class:`RunProfile` records; :mod:`neuron_mlflow.sinks.profiles` reads
them from MLflow (metrics, and ``summary.json`` artifacts for per-op detail beyond the logged
top-k), so it works against any tracking URI.

Example:
    >>> rows = [RunProfile("a", "naive", "profile", {"cpu_time_us": 10.0, "op_calls": 6.0}, {}),
    ...         RunProfile("b", "fused", "profile", {"cpu_time_us": 5.0, "op_calls": 1.0}, {})]
    >>> result = compare_profiles(rows, baseline="a")
    >>> result.time_metric, [round(c, 1) for c in result.headline_change_pct["b"].values()]
    ('cpu_time_us', [-50.0, -83.3])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

HEADLINE = ("device_time_us", "cpu_time_us", "wall_time_us", "op_calls", "steps")
"""Headline metrics, in the order they are shown (``P/<name>``)."""


@dataclass
class RunProfile:
    """One run's latest profile under one prefix.

    Attributes:
        run_id: the run.
        name: the run's name.
        prefix: the metric prefix ``P`` read.
        headline: headline metric name (without prefix) to value.
        ops: op name to ``{"self_device_us", "self_cpu_us", "calls"}`` (whichever exist).
        backend: the ``neuron_mlflow.backend`` tag.
        prefixes: every profile prefix the run has (see :func:`profile_prefixes`).
    """

    run_id: str
    name: str
    prefix: str
    headline: dict[str, float]
    ops: dict[str, dict[str, float]]
    backend: str | None = None
    prefixes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """The result of :func:`compare_profiles` (plain data; see the ``render_*`` functions)."""

    runs: list[RunProfile]
    baseline: str
    time_metric: str
    headline_metrics: list[str]
    headline_change_pct: dict[str, dict[str, float]] = field(default_factory=dict)
    op_rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _pct(new: float, old: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return 100.0 * (new - old) / old


def compare_profiles(
    runs: list[RunProfile], baseline: str | None = None, top: int = 20
) -> Comparison:
    """Compare run profiles on what they share, against ``baseline`` (default: the first).

    Example:
        >>> a = RunProfile("a", "a", "p", {"cpu_time_us": 4.0}, {"aten::mul": {"self_cpu_us": 4.0}})
        >>> b = RunProfile("b", "b", "p", {"cpu_time_us": 2.0}, {"aten::add": {"self_cpu_us": 2.0}})
        >>> [(r["op"], r["status"]["b"]) for r in compare_profiles([a, b]).op_rows]
        [('aten::mul', 'gone'), ('aten::add', 'new')]
    """
    base = next((r for r in runs if r.run_id == baseline), runs[0])
    notes: list[str] = []
    shared = [m for m in HEADLINE if all(m in r.headline for r in runs)]
    skipped = sorted({m for r in runs for m in r.headline} - set(shared), key=HEADLINE.index)
    if skipped:
        notes.append(f"compared only on metrics all runs share; left out: {', '.join(skipped)}")
    backends = {r.backend for r in runs}
    if len(backends) > 1:
        notes.append(f"runs use different backends ({', '.join(sorted(map(str, backends)))})")
    prefixes = {r.prefix for r in runs}
    if len(prefixes) > 1:
        notes.append(f"runs use different prefixes ({', '.join(sorted(prefixes))})")
    time_metric = "device_time_us" if "device_time_us" in shared else "cpu_time_us"
    if time_metric not in shared:
        time_metric = "wall_time_us"
    change = {
        r.run_id: {m: _pct(r.headline[m], base.headline[m]) for m in shared}
        for r in runs
        if r.run_id != base.run_id
    }
    op_field = "self_device_us" if time_metric == "device_time_us" else "self_cpu_us"
    names = list(base.ops)
    names.sort(key=lambda n: -base.ops[n].get(op_field, 0.0))
    names = names[:top]
    for r in runs:
        extra = sorted(
            (n for n in r.ops if n not in base.ops),
            key=lambda n: -r.ops[n].get(op_field, 0.0),
        )
        names.extend(n for n in extra[:top] if n not in names)
    rows = []
    for name in names:
        base_value = base.ops.get(name, {}).get(op_field)
        row: dict[str, Any] = {"op": name, "field": op_field, "values": {}, "status": {}}
        row["delta"], row["delta_pct"] = {}, {}
        for r in runs:
            value = r.ops.get(name, {}).get(op_field)
            row["values"][r.run_id] = value
            if r.run_id == base.run_id:
                continue
            if value is None and base_value is not None:
                row["status"][r.run_id] = "gone"
            elif value is not None and base_value is None:
                row["status"][r.run_id] = "new"
            elif value is not None and base_value is not None:
                row["status"][r.run_id] = ""
                row["delta"][r.run_id] = value - base_value
                row["delta_pct"][r.run_id] = _pct(value, base_value)
        rows.append(row)
    return Comparison(runs, base.run_id, time_metric, shared, change, rows, notes)


def regressions(comparison: Comparison, fail_above_pct: float) -> list[str]:
    """Why the gate fails: one line per run whose headline time exceeds the baseline by more
    than ``fail_above_pct`` percent (empty when it passes).

    Example:
        >>> a = RunProfile("a", "a", "p", {"cpu_time_us": 100.0}, {})
        >>> b = RunProfile("b", "b", "p", {"cpu_time_us": 120.0}, {})
        >>> regressions(compare_profiles([a, b]), 10.0)
        ["run b (b): cpu_time_us 120.0 is 20.0% above the baseline's 100.0 (limit 10%)"]
    """
    base = next(r for r in comparison.runs if r.run_id == comparison.baseline)
    metric = comparison.time_metric
    out = []
    for r in comparison.runs:
        if r.run_id == base.run_id:
            continue
        pct = comparison.headline_change_pct[r.run_id].get(metric)
        if pct is not None and pct > fail_above_pct:
            out.append(
                f"run {r.run_id} ({r.name}): {metric} {r.headline[metric]:.1f} is {pct:.1f}% "
                f"above the baseline's {base.headline[metric]:.1f} (limit {fail_above_pct:g}%)"
            )
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _signed_pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def _tables(c: Comparison) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    base = c.baseline
    head = ["metric", *[f"{r.name} ({r.run_id[:8]})" for r in c.runs]]
    body = []
    for metric in c.headline_metrics:
        row = [metric]
        for r in c.runs:
            cell = _fmt(r.headline[metric])
            if r.run_id != base:
                cell += f" ({_signed_pct(c.headline_change_pct[r.run_id][metric])})"
            row.append(cell)
        body.append(row)
    op_head = ["op", *[r.name for r in c.runs]]
    op_body = []
    for op_row in c.op_rows:
        cells = [op_row["op"]]
        for r in c.runs:
            value = op_row["values"][r.run_id]
            status = op_row["status"].get(r.run_id, "")
            if r.run_id == base:
                cells.append(_fmt(value))
            elif status in ("new", "gone"):
                cells.append(f"{_fmt(value)} [{status}]")
            elif r.run_id not in op_row["delta"]:
                cells.append(_fmt(value))  # in neither this run nor the baseline
            else:
                cells.append(
                    f"{_fmt(value)} ({op_row['delta'][r.run_id]:+.1f}, "
                    f"{_signed_pct(op_row['delta_pct'][r.run_id])})"
                )
        op_body.append(cells)
    return head, body, op_head, op_body


def render_markdown(c: Comparison) -> str:
    """The comparison as Markdown tables (headline, then per-op ``self_*_us`` per step)."""
    head, body, op_head, op_body = _tables(c)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    if op_body:
        field_name = c.op_rows[0]["field"]
        lines += ["", f"Per op ({field_name} per step; change vs baseline):", ""]
        lines += ["| " + " | ".join(op_head) + " |", "|" + "---|" * len(op_head)]
        lines += ["| " + " | ".join(row) + " |" for row in op_body]
    lines += ["", f"Baseline: {c.baseline}. Headline time metric: {c.time_metric}."]
    lines += [f"Note: {note}" for note in c.notes]
    return "\n".join(lines) + "\n"


def render_table(c: Comparison) -> str:
    """The comparison as aligned plain-text tables for a terminal."""
    head, body, op_head, op_body = _tables(c)

    def block(header: list[str], rows: list[list[str]]) -> list[str]:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        fmt = lambda r: "  ".join(  # noqa: E731
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        return [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)]

    lines = block(head, body)
    if op_body:
        lines += ["", f"Per op ({c.op_rows[0]['field']} per step; change vs baseline):"]
        lines += block(op_head, op_body)
    lines += ["", f"Baseline: {c.baseline}. Headline time metric: {c.time_metric}."]
    lines += [f"Note: {note}" for note in c.notes]
    return "\n".join(lines) + "\n"


def render_json(c: Comparison) -> str:
    """The comparison as JSON."""
    data = {
        "baseline": c.baseline,
        "time_metric": c.time_metric,
        "runs": [
            {
                "run_id": r.run_id,
                "name": r.name,
                "prefix": r.prefix,
                "backend": r.backend,
                "headline": r.headline,
            }
            for r in c.runs
        ],
        "headline_change_pct": c.headline_change_pct,
        "ops": c.op_rows,
        "notes": c.notes,
    }
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def profile_from_summary(
    run_id: str, name: str, summary: Any, prefix: str = "profile", backend: str | None = None
) -> RunProfile:
    """A :class:`RunProfile` from a window's :class:`~neuron_mlflow.summary.ops.OpSummary`
    (for comparing windows in hand, without reading MLflow).

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
        >>> profile_from_summary("r1", "naive", s).headline["op_calls"]
        1.0
    """
    headline = {
        "cpu_time_us": summary.cpu_time_us,
        "wall_time_us": summary.wall_time_us,
        "op_calls": summary.op_calls,
        "steps": float(summary.steps),
    }
    if summary.device_time_us is not None:
        headline["device_time_us"] = summary.device_time_us
    ops = {}
    for op in summary.ops:
        ops[op.name] = {"self_cpu_us": op.self_cpu_us, "calls": op.calls}
        if op.self_device_us is not None:
            ops[op.name]["self_device_us"] = op.self_device_us
    return RunProfile(run_id, name, prefix, headline, ops, backend)


def render_seed_markdown(c: Comparison) -> str:
    """``comparison.md``: the seed's side-by-side table of the runs, then the changes.

    Example:
        >>> a = RunProfile("a", "naive", "p", {"cpu_time_us": 125.0, "op_calls": 6.0}, {})
        >>> print(render_seed_markdown(compare_profiles([a, a])).splitlines()[2])
        | naive | n/a | 125.0 | 6 | - |
    """
    lines = [
        "| variant | device time (us) | self CPU (us) | op calls | wall time (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in c.runs:
        h = r.headline
        cells = [
            f"{h['device_time_us']:.1f}" if "device_time_us" in h else "n/a",
            f"{h['cpu_time_us']:.1f}" if "cpu_time_us" in h else "-",
            f"{h['op_calls']:g}" if "op_calls" in h else "-",
            f"{h['wall_time_us']:.1f}" if "wall_time_us" in h else "-",
        ]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + render_markdown(c)
