"""Compare profiled runs: headline metrics side by side and per-op changes against a baseline.

Pure functions over :class:`RunProfile` records (:mod:`neuron_mlflow.sinks.profiles` reads
them from MLflow); what a comparison shows and decides: ``docs/comparing.md``.

Example:
    >>> rows = [RunProfile("a", "naive", "profile", {"cpu_time_us": 10.0, "op_calls": 6.0}, {}),
    ...         RunProfile("b", "fused", "profile", {"cpu_time_us": 5.0, "op_calls": 1.0}, {})]
    >>> result = compare_profiles(rows, baseline="a")
    >>> result.time_metric, [round(c, 1) for c in result.headline_change_pct["b"].values()]
    ('cpu_time_us', [-50.0, -83.3])
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from neuron_mlflow.summary.statistics import (
    CONFIDENCE,
    DEFAULT_MARGIN_PCT,
    IMPROVEMENT,
    INSUFFICIENT,
    MAX_DISTURBED_SHARE,
    NO_CHANGE,
    REGRESSION,
    STATISTIC,
    Estimate,
    compare_samples,
    side_value,
)

HEADLINE = ("device_time_us", "cpu_time_us", "wall_time_us", "op_calls", "steps")
"""Headline metrics, in the order they are shown (``P/<name>``)."""
OP_FIELDS = ("self_device_us", "self_cpu_us", "calls")
"""The op fields compared (``P/op/<key>/<field>``)."""
SAMPLED = ("device_time_us", "cpu_time_us", "wall_time_us", "op_calls")
"""Headline metrics with per-step samples (ratio, interval and verdict)."""
METRIC_LABELS = {
    "device_time_us": "device time",
    "cpu_time_us": "self CPU time",
    "wall_time_us": "wall time",
    "op_calls": "op calls",
    "steps": "steps",
}
"""Headline metrics in words."""
_COMPILED = re.compile(r"(CompiledFxGraph[ _]+)([A-Za-z0-9]{16,})")

RunSamples = dict[str, list[list[float]]]
"""One run's samples: series (a headline metric, or ``op:<key>:<field>``) -> windows -> steps."""


def op_series(key: str, field_name: str) -> str:
    """The samples key of one op's field.

    Example:
        >>> op_series("aten::mm", "self_cpu_us")
        'op:aten::mm:self_cpu_us'
    """
    return f"op:{key}:{field_name}"


def stable_op_names(names: Iterable[str]) -> dict[str, str]:
    """A name that lines up across runs for every op name (given in first-call order): a
    compiled graph's inductor hash becomes its order among the window's compiled graphs
    (``docs/comparing.md``); other names stay as they are.

    Example:
        >>> stable_op_names(["aten::mm", "Call_CompiledFxGraph_fepdjo2lv4abcdefghijklmnop",
        ...                  "Call_CompiledFxGraph_zzzzjo2lv4abcdefghijklmnop"])
        ... # doctest: +NORMALIZE_WHITESPACE
        {'aten::mm': 'aten::mm', 'Call_CompiledFxGraph_fepdjo2lv4abcdefghijklmnop':
         'Call_CompiledFxGraph_#0', 'Call_CompiledFxGraph_zzzzjo2lv4abcdefghijklmnop':
         'Call_CompiledFxGraph_#1'}
    """
    out: dict[str, str] = {}
    graphs: dict[str, int] = {}
    for name in dict.fromkeys(names):
        match = _COMPILED.search(name)
        if match is None:
            out[name] = name
        else:
            order = graphs.setdefault(match.group(2), len(graphs))
            out[name] = name[: match.start(2)] + f"#{order}" + name[match.end(2) :]
    return out


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
        samples: per run (one here; several for a group of runs, :func:`group_profiles`),
            the per-step samples of every window; without them, the headline values and ops
            count as one window of one step (``insufficient data``).
        tags: the run's host load (``load_avg_1m``, ``cpu_steal_pct``, ``cpu_count``,
            ``torch_threads``: the ``naming.HOST_LOAD_TAGS`` tags), for the load warning.
        run_ids: the runs behind this profile (several for a group).
        steps_disturbed: steps of its ``steps.jsonl`` files that other processes disturbed
            (left out of ``samples``); ``steps_read`` all their steps.
    """

    run_id: str
    name: str
    prefix: str
    headline: dict[str, float]
    ops: dict[str, dict[str, float]]
    backend: str | None = None
    prefixes: list[str] = field(default_factory=list)
    samples: list[RunSamples] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)
    steps_disturbed: int = 0
    steps_read: int = 0

    @property
    def every_step_disturbed(self) -> bool:
        """Every step of its ``steps.jsonl`` files was disturbed: no time to show."""
        return 0 < self.steps_read == self.steps_disturbed

    def side(self, series: str) -> list[list[list[float]]]:
        """This profile's samples of one series: runs -> windows -> steps."""
        if self.samples is not None:
            return [run[series] for run in self.samples if run.get(series)]
        if series.startswith("op:"):
            key, field_name = series.removeprefix("op:").rsplit(":", 1)
            value = self.ops.get(key, {}).get(field_name)
        else:
            value = self.headline.get(series)
        return [] if value is None else [[[value]]]


def group_profiles(profiles: Sequence[RunProfile], name: str | None = None) -> RunProfile:
    """Several runs as one side of a comparison: their samples pooled run by run (so run-to-run
    noise counts), their headline values and op values averaged for display.

    Example:
        >>> a = RunProfile("a", "x", "p", {"cpu_time_us": 10.0}, {})
        >>> b = RunProfile("b", "x", "p", {"cpu_time_us": 14.0}, {})
        >>> g = group_profiles([a, b])
        >>> g.name, g.run_ids, g.headline, g.side("cpu_time_us")
        ('x (2 runs)', ['a', 'b'], {'cpu_time_us': 12.0}, [[[10.0]], [[14.0]]])
    """
    if len(profiles) == 1 and name is None:
        return profiles[0]
    names = list(dict.fromkeys(p.name for p in profiles))
    label = name or (
        f"{names[0]} ({len(profiles)} runs)" if len(names) == 1 else "+".join(names[:3])
    )
    shared = [m for m in HEADLINE if all(m in p.headline for p in profiles)]
    headline = {m: sum(p.headline[m] for p in profiles) / len(profiles) for m in shared}
    ops: dict[str, dict[str, float]] = {}
    for key in dict.fromkeys(k for p in profiles for k in p.ops):
        having = [p.ops[key] for p in profiles if key in p.ops]
        fields = {f for row in having for f in row}
        ops[key] = {f: sum(r.get(f, 0.0) for r in having) / len(having) for f in fields}
    samples: list[RunSamples] = []
    for p in profiles:
        if p.samples is None:  # its values: one window of one step each
            ops_run = {op_series(k, f): [[v]] for k, row in p.ops.items() for f, v in row.items()}
            samples.append({m: [[v]] for m, v in p.headline.items()} | ops_run)
        else:
            samples.extend(p.samples)
    tags = {k: v for k, v in profiles[0].tags.items() if all(p.tags.get(k) for p in profiles)}
    for k in tags:  # averaged, so a group's load reads like a run's
        values = [v for p in profiles if (v := _number(p.tags[k])) is not None]
        if values:
            tags[k] = f"{sum(values) / len(values):.2f}"
    return replace(
        profiles[0],
        name=label,
        headline=headline,
        ops=ops,
        samples=samples,
        tags=tags,
        run_ids=[i for p in profiles for i in (p.run_ids or [p.run_id])],
        steps_disturbed=sum(p.steps_disturbed for p in profiles),
        steps_read=sum(p.steps_read for p in profiles),
    )


def _number(text: str | None) -> float | None:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


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
    estimates: dict[str, dict[str, Estimate]] = field(default_factory=dict)
    """Per non-baseline run: headline metric -> :class:`Estimate` (op rows hold their own,
    ``row["estimate"][run_id]``)."""
    margin_pct: float = DEFAULT_MARGIN_PCT
    op_confidence: float = CONFIDENCE
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    """What every surface shows per run and headline metric: the :data:`STATISTIC` of its
    samples (the value its verdicts are decided on); without samples, the logged value."""
    outcome: Outcome | None = None
    """The one answer: :func:`decide`."""

    @property
    def statistic(self) -> str:
        """What the values are: ``self CPU time, 10th-percentile step``."""
        return f"{METRIC_LABELS.get(self.time_metric, self.time_metric)}, {STATISTIC}"

    def render(self, fmt: str = "table") -> str:
        """The comparison as text: ``table`` (a terminal's), ``markdown``, ``json``, or
        ``seed`` (the result and the seed's side-by-side table with the verdicts)."""
        if fmt in ("table", "markdown"):
            return _render(self, markdown=fmt == "markdown")
        return {"json": render_json, "seed": render_seed_table}[fmt](self)


@dataclass(frozen=True)
class Outcome:
    """The one answer of a comparison (:func:`decide`): ``fastest`` is named only when decided
    against ``runner_up`` (``estimate``: the pair's); ``speedup``: the runner-up's value over
    the fastest's; ``result``: ``rms_norm fastest: 2.41x vs compiled`` or ``no winner: ...``;
    ``detail``: why, in full.
    """

    fastest: str | None
    runner_up: str | None
    speedup: float | None
    estimate: Estimate | None
    result: str
    detail: str


def _mostly_disturbed(p: RunProfile) -> bool:
    """More than :data:`MAX_DISTURBED_SHARE` of the run's steps disturbed: no verdict."""
    return p.steps_read > 0 and p.steps_disturbed > MAX_DISTURBED_SHARE * p.steps_read


def _estimate(
    base: RunProfile,
    cand: RunProfile,
    series: str,
    margin_pct: float,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """:func:`compare_samples` of one series, with the sides' disturbed steps said (no verdict
    when a side is :func:`_mostly_disturbed`)."""
    e = compare_samples(base.side(series), cand.side(series), margin_pct, confidence, name=series)
    worst = max((base, cand), key=lambda p: p.steps_disturbed / max(p.steps_read, 1))
    if not worst.steps_disturbed:
        return e
    said = (
        f"{worst.steps_disturbed} of {worst.steps_read} steps disturbed by other processes "
        f"({worst.name})"
    )
    if _mostly_disturbed(worst):
        return replace(e, verdict=INSUFFICIENT, low=None, high=None, reason=said)
    return replace(e, reason=f"{e.reason}; {said}, left out")


def _pct(new: float, old: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return 100.0 * (new - old) / old


def compare_profiles(
    runs: list[RunProfile],
    baseline: str | None = None,
    top: int = 20,
    margin_pct: float | None = None,
) -> Comparison:
    """Compare run profiles on what they share, against ``baseline`` (default: the first): every
    headline metric with samples (:data:`SAMPLED`) and every op on both sides gets a ratio, an
    interval and a verdict at ``margin_pct`` (default 5).

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
    for what, found in (
        ("backends", {str(r.backend) for r in runs}),
        ("prefixes", {r.prefix for r in runs}),
    ):
        if len(found) > 1:
            notes.append(f"runs use different {what} ({', '.join(sorted(found))})")
    time_metric = next(
        (m for m in ("device_time_us", "cpu_time_us") if m in shared), "wall_time_us"
    )
    shown = {  # None: every step disturbed, nothing to show
        r.run_id: {m: v for m in shared if (v := _shown(r, m, r.headline[m])) is not None}
        for r in runs
    }
    change = {
        r.run_id: {
            m: _pct(shown[r.run_id][m], shown[base.run_id][m])
            for m in shared
            if m in shown[r.run_id] and m in shown[base.run_id]
        }
        for r in runs
        if r.run_id != base.run_id
    }
    op_field = "self_device_us" if time_metric == "device_time_us" else "self_cpu_us"
    names = sorted(base.ops, key=lambda n: -base.ops[n].get(op_field, 0.0))[:top]
    for r in runs:
        extra = sorted(
            (n for n in r.ops if n not in base.ops),
            key=lambda n: -r.ops[n].get(op_field, 0.0),
        )
        names.extend(n for n in extra[:top] if n not in names)
    rows = []
    for name in names:
        series = op_series(name, op_field)
        base_value = _shown(base, series, base.ops.get(name, {}).get(op_field))
        row: dict[str, Any] = {"op": name, "field": op_field, "values": {}, "status": {}}
        row |= {"delta": {}, "delta_pct": {}, "estimate": {}}
        for r in runs:
            value = _shown(r, series, r.ops.get(name, {}).get(op_field))
            row["values"][r.run_id] = value
            if r.run_id == base.run_id:
                continue
            here, there = _has_op(r, name, op_field), _has_op(base, name, op_field)
            if here or there:
                row["status"][r.run_id] = "" if here and there else "new" if here else "gone"
            if value is not None and base_value is not None:
                row["delta"][r.run_id] = value - base_value
                row["delta_pct"][r.run_id] = _pct(value, base_value)
        rows.append(row)
    margin = DEFAULT_MARGIN_PCT if margin_pct is None else margin_pct
    estimates = {
        r.run_id: {m: _estimate(base, r, m, margin) for m in shared if m in SAMPLED}
        for r in runs
        if r.run_id != base.run_id
    }
    both = sum(1 for row in rows for st in row["status"].values() if st == "")
    op_confidence = 1 - (1 - CONFIDENCE) / max(both, 1)
    for row in rows:
        series = op_series(row["op"], op_field)
        for r in runs:
            if row["status"].get(r.run_id) == "":
                row["estimate"][r.run_id] = _estimate(base, r, series, margin, op_confidence)
    notes += load_notes(runs)
    notes += [
        f"{r.name}: {r.steps_disturbed} of {r.steps_read} steps disturbed by other processes "
        "(left out of every value and verdict)"
        for r in runs
        if r.steps_disturbed
    ]
    comparison = Comparison(
        runs,
        base.run_id,
        time_metric,
        shared,
        change,
        rows,
        notes,
        estimates,
        margin,
        op_confidence,
        shown,
    )
    comparison.outcome = decide(comparison)
    return comparison


def _has_op(r: RunProfile, name: str, field_name: str) -> bool:
    """The run has this field of the op: in its latest window, or in its steps (disturbed ones
    too: an op of a run whose every step was disturbed is there, untimed)."""
    return field_name in r.ops.get(name, {}) or bool(r.side(op_series(name, field_name)))


def _shown(r: RunProfile, series: str, logged: float | None) -> float | None:
    """What a run shows for one series: the :data:`STATISTIC` of its samples, else the logged
    value (``steps``, an old run, or a count: load cannot change it); ``None`` for a time when
    every step was disturbed."""
    if series == "steps" or r.samples is None:
        return logged
    found = side_value(r.side(series))
    counts = series == "op_calls" or series.endswith(":calls")
    if found is None and r.every_step_disturbed and not counts:
        return None
    return logged if found is None else found


def _disturbed_result(p: RunProfile) -> str:
    return (
        f"no winner: insufficient data ({p.name}: {p.steps_disturbed} of {p.steps_read} "
        "steps disturbed)"
    )


def decide(c: Comparison) -> Outcome:
    """The one answer: the fastest run by the headline time, named only when its difference to
    the runner-up is decided (``docs/comparing.md``, "One answer").

    Example:
        >>> fast = RunProfile("a", "fused", "p", {"cpu_time_us": 50.0}, {},
        ...                   samples=[{"cpu_time_us": [[50.0, 51, 49, 50, 50, 51]]}])
        >>> slow = RunProfile("b", "naive", "p", {"cpu_time_us": 100.0}, {},
        ...                   samples=[{"cpu_time_us": [[100.0, 101, 99, 100, 100, 101]]}])
        >>> decide(compare_profiles([slow, fast])).result
        'fused fastest: 2.01x vs naive'
        >>> decide(compare_profiles([slow, slow])).result
        'no winner: naive and naive within 5%'
    """
    metric = c.time_metric
    shown = {r.run_id: c.values.get(r.run_id, {}).get(metric) for r in c.runs}
    unseen = [r for r in c.runs if shown[r.run_id] is None]
    if unseen:  # a run with every step disturbed may be the fastest
        return Outcome(None, None, None, None, _disturbed_result(unseen[0]), c.statistic)
    if len(c.runs) < 2:
        return Outcome(None, None, None, None, "no winner: nothing to compare", c.statistic)
    fastest, runner = sorted(c.runs, key=lambda r: shown[r.run_id] or 0.0)[:2]
    # against the baseline, the verdicts every other surface shows; else the pair itself
    wanted, e = IMPROVEMENT, None
    if runner.run_id == c.baseline:
        e = c.estimates.get(fastest.run_id, {}).get(metric)
    elif fastest.run_id == c.baseline:
        wanted, e = REGRESSION, c.estimates.get(runner.run_id, {}).get(metric)
    if e is None:
        wanted, e = IMPROVEMENT, _estimate(runner, fastest, metric, c.margin_pct)
    speedup = (shown[runner.run_id] or 0.0) / max(shown[fastest.run_id] or 0.0, 1e-12)
    first, second = (runner, fastest) if wanted == REGRESSION else (fastest, runner)
    detail = (
        f"{c.statistic}; {first.name} vs {second.name}: "
        f"{e.interval_text()} {e.verdict} ({e.reason})"
    )
    if e.verdict == wanted:
        result = f"{fastest.name} fastest: {speedup:.2f}x vs {runner.name}"
        return Outcome(fastest.name, runner.name, speedup, e, result, detail)
    if e.verdict == NO_CHANGE:
        result = f"no winner: {fastest.name} and {runner.name} within {c.margin_pct:g}%"
    elif any(_mostly_disturbed(p) for p in (fastest, runner)):
        result = _disturbed_result(next(p for p in (fastest, runner) if _mostly_disturbed(p)))
    else:
        why = "too close to call" if e.low is not None else "too few samples"  # (detail: why)
        result = f"no winner: insufficient data, {why} ({fastest.name} vs {runner.name})"
    return Outcome(None, runner.name, None, e, result, detail)


LOAD_PER_CPU_GAP = 0.5
"""Load warning: the 1-minute load average per CPU differs by more than this ..."""
STEAL_PCT = 5.0
"""... or a side's CPU steal was above this percentage."""


def load_notes(runs: Sequence[RunProfile]) -> list[str]:
    """Warnings when the runs ran under different host load (their host-load tags).

    Example:
        >>> tags = lambda load, steal: {"load_avg_1m": load, "cpu_count": "2",
        ...                             "cpu_steal_pct": steal}
        >>> a = RunProfile("a", "a", "p", {}, {}, tags=tags("0.1", "0.0"))
        >>> b = RunProfile("b", "b", "p", {}, {}, tags=tags("3.9", "12.0"))
        >>> load_notes([a, b])  # doctest: +NORMALIZE_WHITESPACE
        ['runs ran under different host load (1-min load average per CPU: a 0.05, b 1.95;
          CPU steal: a 0.0%, b 12.0%): timings may differ for that reason alone']
    """
    per_cpu: dict[str, float] = {}
    steal: dict[str, float] = {}
    for r in runs:
        load, cpus, stolen = (
            _number(r.tags.get(k)) for k in ("load_avg_1m", "cpu_count", "cpu_steal_pct")
        )
        if load is not None and cpus:
            per_cpu[r.name] = load / cpus
        if stolen is not None:
            steal[r.name] = stolen
    differ = (per_cpu and max(per_cpu.values()) - min(per_cpu.values()) > LOAD_PER_CPU_GAP) or (
        steal and max(steal.values()) > STEAL_PCT and len(set(steal.values())) > 1
    )
    if not differ:
        return []
    load_text = ", ".join(f"{n} {v:.2f}" for n, v in per_cpu.items())
    steal_text = ", ".join(f"{n} {v:.1f}%" for n, v in steal.items())
    return [
        f"runs ran under different host load (1-min load average per CPU: {load_text}; "
        f"CPU steal: {steal_text}): timings may differ for that reason alone"
    ]


GATE_OP_SHARE = 0.01
"""``--ops`` gates only ops that take at least this share of the baseline's headline time:
below it, the profiler's timer resolution decides (an op of 0.05 us a call)."""


def _gated(c: Comparison, ops: bool) -> list[tuple[RunProfile, str, Estimate]]:
    """The rows the gate looks at (:func:`regressions`), ops down to :data:`GATE_OP_SHARE`."""
    out = []
    for r in c.runs:
        if r.run_id == c.baseline:
            continue
        found = c.estimates.get(r.run_id, {}).get(c.time_metric)
        if found is not None:
            out.append((r, c.time_metric, found))
        if ops:
            floor = GATE_OP_SHARE * (found.baseline or 0.0) if found is not None else 0.0
            for row in c.op_rows:
                estimate = row.get("estimate", {}).get(r.run_id)
                if estimate is not None and (estimate.baseline or 0.0) >= floor:
                    out.append((r, f"op {row['op']} ({row['field']})", estimate))
    return out


def regressions(comparison: Comparison, fail_above_pct: float, ops: bool = False) -> list[str]:
    """Why the gate fails: one line per gated row (:func:`_gated`) whose interval's lower bound
    is above ``1 + fail_above_pct / 100``.

    Example:
        >>> a = RunProfile("a", "a", "p", {"cpu_time_us": 100.0}, {},
        ...                samples=[{"cpu_time_us": [[100.0, 101, 99, 100, 100, 101]]}])
        >>> b = RunProfile("b", "b", "p", {"cpu_time_us": 120.0}, {},
        ...                samples=[{"cpu_time_us": [[120.0, 121, 119, 120, 120, 121]]}])
        >>> regressions(compare_profiles([a, b], margin_pct=10), 10.0)  # doctest: +ELLIPSIS
        ['run b (b): cpu_time_us 1.20x [1.19, 1.21] of the baseline: the whole interval is ...']
    """
    limit = 1 + fail_above_pct / 100
    return [
        f"run {r.run_id} ({r.name}): {what} {e.interval_text()} of the baseline: the whole "
        f"interval is above {limit:.2f} (limit {fail_above_pct:g}%)"
        for r, what, e in _gated(comparison, ops)
        if e.low is not None and e.low > limit
    ]


def undecided(comparison: Comparison, fail_above_pct: float, ops: bool = False) -> list[str]:
    """Gated rows the gate cannot decide: too few samples, or an interval that reaches above
    ``1 + fail_above_pct / 100`` without its lower bound being above it.

    Example:
        >>> a = RunProfile("a", "a", "p", {"cpu_time_us": 100.0}, {})
        >>> b = RunProfile("b", "b", "p", {"cpu_time_us": 150.0}, {})
        >>> undecided(compare_profiles([a, b]), 10.0)  # doctest: +ELLIPSIS
        ['run b (b): cpu_time_us: insufficient data (too few samples on the baseline and ...)']
    """
    limit = 1 + fail_above_pct / 100
    out = []
    for r, what, e in _gated(comparison, ops):
        if e.low is None or e.high is None:  # too few samples, or a side mostly disturbed
            reason = e.reason
        elif e.low <= limit < e.high:
            reason = (
                f"too wide to decide: the interval {e.interval_text()} reaches above {limit:.2f}"
            )
        else:
            continue
        out.append(f"run {r.run_id} ({r.name}): {what}: {INSUFFICIENT} ({reason})")
    return out


def undecided_advice(comparison: Comparison) -> str:
    """What would let the gate decide: a quieter machine when a side's steps were mostly
    disturbed, else more steps, windows or runs."""
    busy = [r for r in comparison.runs if _mostly_disturbed(r)]
    if not busy:
        return (
            "profile more steps or windows (Schedule(active=20, repeat=3)) or give each side "
            "several runs"
        )
    said = "; ".join(
        f"every step of {r.name} was disturbed"
        if r.every_step_disturbed
        else f"{r.steps_disturbed} of {r.steps_read} steps of {r.name} were disturbed"
        for r in busy
    )
    return (
        f"{said} by other processes: rerun on a quieter machine (no other busy processes "
        "on its CPUs)"
    )


UNTIMED = "every step disturbed"
"""Shown instead of a time when every step of the run was disturbed by other processes."""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _tables(c: Comparison) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    head = ["metric", *[f"{r.name} ({r.run_id[:8]})" for r in c.runs]]
    body = []
    for metric in c.headline_metrics:
        row = [metric]
        for r in c.runs:
            value = c.values[r.run_id].get(metric)
            pct = c.headline_change_pct.get(r.run_id, {}).get(metric)
            cell = _fmt(value)
            if value is None and r.every_step_disturbed:
                cell += f" [{UNTIMED}]"
            elif pct is not None:
                cell += f" ({pct:+.1f}%)"
            row.append(cell)
        body.append(row)
    op_head = ["op", *[r.name for r in c.runs]]
    op_body = []
    for op_row in c.op_rows:
        cells = [op_row["op"]]
        for r in c.runs:
            value = op_row["values"][r.run_id]
            status = op_row["status"].get(r.run_id, "")
            if status in ("new", "gone"):
                cells.append(f"{_fmt(value)} [{status}]")
            elif value is None and r.every_step_disturbed:
                cells.append(f"- [{UNTIMED}]")
            elif r.run_id not in op_row["delta"]:  # the baseline, or in neither
                cells.append(_fmt(value))
            else:
                cells.append(
                    f"{_fmt(value)} ({op_row['delta'][r.run_id]:+.1f}, "
                    f"{op_row['delta_pct'][r.run_id]:+.1f}%)"
                )
        op_body.append(cells)
    return head, body, op_head, op_body


_ONLY = {"new": "only in the candidate", "gone": "only in the baseline"}


def stat_rows(c: Comparison) -> list[dict[str, Any]]:
    """One row per candidate and headline metric, then per candidate and op: what, run,
    :class:`Estimate` (``None`` for an op on one side only) and ``verdict``.

    Example:
        >>> a = RunProfile("a", "a", "p", {"cpu_time_us": 1.0}, {"x": {"self_cpu_us": 1.0}})
        >>> b = RunProfile("b", "b", "p", {"cpu_time_us": 1.0}, {"y": {"self_cpu_us": 1.0}})
        >>> [(r["what"], r["verdict"]) for r in stat_rows(compare_profiles([a, b]))]
        ... # doctest: +NORMALIZE_WHITESPACE
        [('cpu_time_us', 'insufficient data'), ('op x', 'only in the baseline'),
         ('op y', 'only in the candidate')]
    """
    rows = []
    for r in c.runs:
        if r.run_id == c.baseline:
            continue
        for metric, e in c.estimates.get(r.run_id, {}).items():
            rows.append({"what": metric, "run": r, "estimate": e, "verdict": e.verdict})
        for op_row in c.op_rows:
            e = op_row["estimate"].get(r.run_id)
            verdict = e.verdict if e is not None else _ONLY.get(op_row["status"].get(r.run_id))
            if verdict is not None:
                what = f"op {op_row['op']}"
                rows.append({"what": what, "run": r, "estimate": e, "verdict": verdict})
    return rows


def stat_table(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """:func:`stat_rows` as text cells (the header, the rows), for every surface."""
    head = ["metric", "candidate", "baseline", "value", "ratio [interval]", "verdict", "steps"]
    body = []
    for row in stat_rows(c):
        e = row["estimate"]
        cells = ["-"] * 3 if e is None else [_fmt(e.baseline), _fmt(e.candidate), e.interval_text()]
        steps = "-" if e is None else f"{e.steps[0]}/{e.steps[1]}"
        body.append([row["what"], row["run"].name, *cells, row["verdict"], steps])
    return head, body


def _markdown_block(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _aligned_block(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(  # noqa: E731
        cell.ljust(w) if i == 0 else cell.rjust(w)
        for i, (cell, w) in enumerate(zip(r, widths, strict=True))
    )
    return [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)]


def _render(c: Comparison, markdown: bool, result: bool = True) -> str:
    """The result, the headline, per-op and how-sure tables, as Markdown (a blank line between
    a table's title and the table) or as aligned plain text."""
    block, gap = (_markdown_block, [""]) if markdown else (_aligned_block, [])
    head, body, op_head, op_body = _tables(c)
    lines = []
    if result and c.outcome is not None:
        lines.append(f"Result: {c.outcome.result} ({c.statistic})")
    lines += [
        f"Values: per run, the {STATISTIC} of its undisturbed steps, all windows pooled "
        "(a group of runs: their mean).",
        "",
        *block(head, body),
    ]
    if op_body:
        lines += ["", f"Per op ({c.op_rows[0]['field']} per step; change vs baseline):", *gap]
        lines += block(op_head, op_body)
    stat_head, stat_body = stat_table(c)
    if stat_body:
        title = (
            f"How sure (candidate / baseline of the {STATISTIC}, {100 * CONFIDENCE:g}% interval; "
            f"ops {100 * c.op_confidence:.2f}%, Bonferroni; verdict at +-{c.margin_pct:g}%; "
            "steps: baseline/candidate, undisturbed):"
        )
        lines += ["", title, *gap, *block(stat_head, stat_body)]
    lines += ["", f"Baseline: {c.baseline}. Headline time metric: {c.time_metric}."]
    lines += [f"Note: {note}" for note in c.notes]
    return "\n".join(lines) + "\n"


_JSON_RUN_FIELDS = (
    "run_id",
    "name",
    "prefix",
    "backend",
    "headline",
    "steps_disturbed",
    "steps_read",
)


def render_json(c: Comparison) -> str:
    data = {
        "baseline": c.baseline,
        "time_metric": c.time_metric,
        "statistic": c.statistic,
        "values": c.values,
        "outcome": c.outcome,
        "runs": [
            {k: getattr(r, k) for k in _JSON_RUN_FIELDS}
            | {"run_ids": r.run_ids or [r.run_id], "host_load": r.tags}
            for r in c.runs
        ],
        "headline_change_pct": c.headline_change_pct,
        "ops": c.op_rows,
        "estimates": c.estimates,
        "margin_pct": c.margin_pct,
        "confidence": CONFIDENCE,
        "op_confidence": c.op_confidence,
        "notes": c.notes,
    }
    return json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n"


def _json_default(value: Any) -> Any:
    return asdict(value) if isinstance(value, Estimate | Outcome) else str(value)


def render_seed_table(c: Comparison) -> str:
    """The result, then the seed's side-by-side table of the runs: every value the
    :data:`STATISTIC`, with the headline time's ratio to the baseline and its verdict.

    Example:
        >>> a = RunProfile("a", "naive", "p", {"cpu_time_us": 125.0, "op_calls": 6.0}, {})
        >>> print(render_seed_table(compare_profiles([a, a])).splitlines()[6])
        | naive | n/a | 125.0 | 6 | - | baseline | - |
    """
    label = METRIC_LABELS.get(c.time_metric, c.time_metric)
    lines = [
        f"Result: {c.outcome.result} ({c.statistic})" if c.outcome else "Result: -",
        "",
        f"Per variant, the {STATISTIC} (us per step; {label} decides):",
        "",
        "| variant | device time (us) | self CPU (us) | op calls | wall time (us) "
        f"| {label} vs baseline | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in c.runs:
        h = c.values[r.run_id]
        cells = [
            f"{h['device_time_us']:.1f}" if "device_time_us" in h else "n/a",
            f"{h['cpu_time_us']:.1f}" if "cpu_time_us" in h else "-",
            f"{h['op_calls']:g}" if "op_calls" in h else "-",
            f"{h['wall_time_us']:.1f}" if "wall_time_us" in h else "-",
        ]
        e = c.estimates.get(r.run_id, {}).get(c.time_metric)
        if r.run_id == c.baseline:
            cells += ["baseline", "-"]
        else:
            cells += ["-", "-"] if e is None else [e.interval_text(), e.verdict]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_seed_markdown(c: Comparison) -> str:
    """``comparison.md``: :func:`render_seed_table`, then the changes and how sure (the
    ``markdown`` rendering without its result line).

    Example:
        >>> a = RunProfile("a", "naive", "p", {"cpu_time_us": 125.0, "op_calls": 6.0}, {})
        >>> render_seed_markdown(compare_profiles([a, a])).splitlines()[0]  # doctest: +ELLIPSIS
        'Result: no winner: insufficient data, too few samples (naive vs naive) (self CPU time...'
    """
    return render_seed_table(c) + "\n" + _render(c, markdown=True, result=False)
