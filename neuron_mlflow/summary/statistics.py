"""How sure a comparison is: the ratio candidate / baseline with a confidence interval, and a
verdict (pure Python, seeded, no numpy).

The data of one side (baseline or candidate) is nested: runs, each a list of windows, each a
list of per-step values (one metric: a headline time, or one op's self time, per step).

**The statistic.** Each window counts by the *median* of its steps (the first step left out
when it is an outlier: :func:`kept_steps`); a run by the mean of its windows' medians; a side
by the mean of its runs. The median, because contention on a shared host only ever adds time
to some steps; the means over windows and runs, so each window and each run weighs the same.
The ratio is candidate / baseline of those side values.

**The interval** is a percentile bootstrap that resamples at every level, so that run-to-run
and window-to-window noise count, not only step-to-step noise (steps of one window are not
independent samples of what a run on another day would measure): each replicate draws the
runs of a side with replacement, then the windows of each drawn run with replacement, then
for each drawn window a bootstrap replicate of its median (its kept steps drawn with
replacement; a pool of :data:`STEP_POOL` replicates is drawn once per window). With one run
per side, run-to-run noise can only show through the windows: give each side several runs
(``--baseline R1 R2 R3``) to make it count in full.

**Assumptions.** Runs are exchangeable (the same code under the same conditions), as are the
windows of a run; steps inside a window are treated as exchangeable too (a slow drift inside
one window widens nothing). Percentile intervals from few units (2-3 windows) are too narrow
rather than too wide; the margin (below) is what protects the verdict then.

**The verdict**, with a margin ``m`` (``--fail-above`` PCT, else :data:`DEFAULT_MARGIN_PCT`):

=====================  ==============================================================
verdict                when
=====================  ==============================================================
``regression``         the interval's lower bound is above ``1 + m``
``improvement``        the interval's upper bound is below ``1 / (1 + m)``
``no change``          the whole interval lies within ``[1 / (1 + m), 1 + m]``
``insufficient data``  either side has fewer than :data:`MIN_STEPS` kept steps (and fewer
                       than :data:`MIN_WINDOWS` windows), the baseline is 0, or the
                       interval straddles ``1 + m`` or ``1 / (1 + m)`` (too wide to decide)
=====================  ==============================================================

Example:
    >>> base = [[[100.0, 101, 99, 100, 102, 98, 100]]]
    >>> cand = [[[130.0, 131, 129, 130, 132, 128, 130]]]
    >>> e = compare_samples(base, cand, margin_pct=10)
    >>> round(e.ratio, 2), e.verdict
    (1.3, 'regression')
    >>> compare_samples([[[5.0]]], [[[6.0]]]).verdict
    'insufficient data'
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

REGRESSION, IMPROVEMENT, NO_CHANGE, INSUFFICIENT = (
    "regression",
    "improvement",
    "no change",
    "insufficient data",
)
VERDICTS = (REGRESSION, IMPROVEMENT, NO_CHANGE, INSUFFICIENT)
DEFAULT_MARGIN_PCT = 5.0
"""The margin of the verdicts when no ``--fail-above`` is given (percent)."""
CONFIDENCE = 0.95
"""Confidence level of the intervals (per-op intervals: Bonferroni, see ``compare``)."""
RESAMPLES = 2000
"""Bootstrap replicates (more when a corrected level needs deeper tails)."""
STEP_POOL = 200
"""Bootstrap replicates of each window's median, drawn once per window."""
MIN_STEPS = 5
"""Kept steps a side needs (over all its windows) for a verdict ..."""
MIN_WINDOWS = 3
"""... unless it has at least this many windows (old runs: one value per window)."""
OUTLIER_FENCE = 1.5
"""Tukey's fence for the first step: ``Q1 - 1.5 IQR`` .. ``Q3 + 1.5 IQR`` of the others."""
SEED = 20240523

Side = Sequence[Sequence[Sequence[float]]]
"""One side: runs -> windows -> per-step values."""


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between order statistics.

    Example:
        >>> quantile([1.0, 2.0, 3.0, 4.0], 0.5), quantile([7.0], 0.25)
        (2.5, 7.0)
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    at = q * (len(ordered) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def median(values: Sequence[float]) -> float:
    """The median.

    Example:
        >>> median([3.0, 1.0, 2.0])
        2.0
    """
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    """The interquartile range (Q3 - Q1).

    Example:
        >>> iqr([1.0, 2.0, 3.0, 4.0, 5.0])
        2.0
    """
    return quantile(values, 0.75) - quantile(values, 0.25)


def first_step_outlier(values: Sequence[float]) -> bool:
    """True when the first step of a window is an outlier against the window's other steps.

    The rule: the first step lies outside Tukey's fences of the *other* steps, below
    ``Q1 - 1.5 IQR`` or above ``Q3 + 1.5 IQR`` (the IQR floored at 1 % of their median, so
    steps quantised to one value do not make every difference an outlier). It needs at least
    4 other steps; with fewer, the first step is kept.

    Example:
        >>> first_step_outlier([900.0, 100, 102, 98, 101, 99])
        True
        >>> first_step_outlier([103.0, 100, 102, 98, 101, 99]), first_step_outlier([900.0, 1, 2])
        (False, False)
    """
    rest = list(values[1:])
    if len(rest) < 4:
        return False
    q1, q3 = quantile(rest, 0.25), quantile(rest, 0.75)
    spread = max(q3 - q1, 0.01 * abs(median(rest)))
    return not (q1 - OUTLIER_FENCE * spread <= values[0] <= q3 + OUTLIER_FENCE * spread)


def kept_steps(values: Sequence[float]) -> list[float]:
    """The steps of one window that comparisons use: all but an outlying first step.

    Example:
        >>> kept_steps([900.0, 100, 102, 98, 101, 99])
        [100, 102, 98, 101, 99]
    """
    return list(values[1:]) if first_step_outlier(values) else list(values)


@dataclass(frozen=True)
class Estimate:
    """The comparison of one metric: ratio candidate / baseline, its interval and verdict.

    Attributes:
        verdict: one of :data:`VERDICTS`.
        ratio: candidate / baseline (``None`` when either side has no data or the baseline
            is 0).
        low, high: the interval's bounds (``None`` without ``ratio``, or with too few
            samples).
        baseline, candidate: each side's value (mean over runs of the mean over windows of
            the median of steps).
        steps: kept steps per side ``(baseline, candidate)``; ``windows``, ``runs`` likewise.
        confidence: the interval's level.
        reason: why the verdict, in words.
    """

    verdict: str
    ratio: float | None
    low: float | None
    high: float | None
    baseline: float | None
    candidate: float | None
    steps: tuple[int, int]
    windows: tuple[int, int]
    runs: tuple[int, int]
    confidence: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return asdict(self)

    def interval_text(self) -> str:
        """``1.30x [1.25, 1.36]``, or ``-`` without a ratio.

        Example:
            >>> compare_samples([[[1.0, 1, 1, 1, 1]]], [[[2.0, 2, 2, 2, 2]]]).interval_text()
            '2.00x [2.00, 2.00]'
        """
        if self.ratio is None:
            return "-"
        if self.low is None or self.high is None:
            return f"{self.ratio:.2f}x [no interval]"
        return f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def _clean(side: Side) -> list[list[list[float]]]:
    """Runs -> windows -> kept steps, without empty windows and runs."""
    runs = []
    for run in side:
        windows = [kept_steps([float(v) for v in w]) for w in run if len(w)]
        if windows:
            runs.append(windows)
    return runs


def _side_value(runs: list[list[float]]) -> float:
    return sum(sum(w) / len(w) for w in runs) / len(runs)


def _pools(runs: list[list[list[float]]], rng: random.Random) -> list[list[list[float]]]:
    """Per window: :data:`STEP_POOL` bootstrap replicates of its median (itself if 1 step)."""
    out = []
    for run in runs:
        pools = []
        for steps in run:
            if len(steps) == 1:
                pools.append(steps)
                continue
            n = len(steps)
            pools.append([median(rng.choices(steps, k=n)) for _ in range(STEP_POOL)])
        out.append(pools)
    return out


def _replicate(pools: list[list[list[float]]], rng: random.Random) -> float:
    choice = rng.choice
    total = 0.0
    for _ in pools:
        run = choice(pools)
        total += sum(choice(choice(run)) for _ in run) / len(run)
    return total / len(pools)


def _seed(name: str) -> int:
    return SEED ^ zlib.crc32(name.encode("utf-8"))


def compare_samples(
    baseline: Side,
    candidate: Side,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    confidence: float = CONFIDENCE,
    name: str = "",
    resamples: int = RESAMPLES,
) -> Estimate:
    """Compare two sides (runs -> windows -> per-step values): ratio, interval, verdict.

    Deterministic: the bootstrap is seeded from :data:`SEED` and ``name`` (the metric).

    Args:
        baseline: the baseline's samples.
        candidate: the candidate's samples.
        margin_pct: the verdicts' margin ``m`` (percent; see the module docstring).
        confidence: the interval's level (0..1).
        name: the metric's name (seeds the bootstrap, so each metric has its own draws).
        resamples: bootstrap replicates (raised when the level needs deeper tails).

    Example:
        >>> same = [[[10.0, 10.2, 9.9, 10.1, 10.0, 9.8]], [[10.1, 9.9, 10.0, 10.2, 10.1, 9.9]]]
        >>> compare_samples(same, same).verdict
        'no change'
    """
    sides = [_clean(baseline), _clean(candidate)]
    steps = tuple(sum(len(w) for run in s for w in run) for s in sides)
    windows = tuple(sum(len(run) for run in s) for s in sides)
    runs = tuple(len(s) for s in sides)

    def estimate(
        verdict: str,
        reason: str,
        ratio: float | None = None,
        interval: tuple[float | None, float | None] = (None, None),
    ) -> Estimate:
        return Estimate(
            verdict,
            ratio,
            interval[0],
            interval[1],
            values[0],
            values[1],
            (steps[0], steps[1]),
            (windows[0], windows[1]),
            (runs[0], runs[1]),
            confidence,
            reason,
        )

    values: tuple[float | None, float | None] = (None, None)
    if not all(sides):
        missing = "baseline" if not sides[0] else "candidate"
        return estimate(INSUFFICIENT, f"no samples on the {missing} side")
    base_value = _side_value([[median(w) for w in run] for run in sides[0]])
    cand_value = _side_value([[median(w) for w in run] for run in sides[1]])
    values = (base_value, cand_value)
    if base_value <= 0:
        return estimate(INSUFFICIENT, "the baseline is 0: no ratio")
    ratio = cand_value / base_value
    tail = (1.0 - confidence) / 2
    rng = random.Random(_seed(name))
    pools = [_pools(s, rng) for s in sides]
    n = max(resamples, math.ceil(10 / tail)) if tail > 0 else resamples
    ratios = []
    for _ in range(n):
        b = _replicate(pools[0], rng)
        c = _replicate(pools[1], rng)
        ratios.append(c / b if b > 0 else math.inf)
    low, high = quantile(ratios, tail), quantile(ratios, 1 - tail)
    m = margin_pct / 100.0
    upper, lower = 1.0 + m, 1.0 / (1.0 + m)
    few = [
        side
        for side, s, w in zip(("baseline", "candidate"), steps, windows, strict=True)
        if s < MIN_STEPS and w < MIN_WINDOWS
    ]
    band = f"[{lower:.3f}, {upper:.3f}]"
    if few:  # no interval: a few draws of one or two values say nothing about the noise
        reason = (
            f"too few samples on the {' and '.join(few)} side "
            f"(need {MIN_STEPS} steps or {MIN_WINDOWS} windows a side)"
        )
        return estimate(INSUFFICIENT, reason, ratio)
    if low > upper:
        verdict, reason = REGRESSION, f"the whole interval is above {upper:.3f}"
    elif high < lower:
        verdict, reason = IMPROVEMENT, f"the whole interval is below {lower:.3f}"
    elif lower <= low and high <= upper:
        verdict, reason = NO_CHANGE, f"the whole interval is within {band}"
    else:
        verdict = INSUFFICIENT
        reason = f"the interval [{low:.3f}, {high:.3f}] is too wide to decide at +-{margin_pct:g}%"
    return estimate(verdict, reason, ratio, (low, high))


def steps_needed(cv_pct: float, margin_pct: float, confidence: float = CONFIDENCE) -> int:
    """Rough steps a side needs so that noise of ``cv_pct`` (the steps' coefficient of
    variation) gives an interval of the median ratio within ``margin_pct`` / 2 either side.

    The median of ``n`` steps has a standard error of about ``1.25 sigma / sqrt(n)``; a
    ratio of two such has ``sqrt(2)`` times that.

    Example:
        >>> steps_needed(10.0, 10.0)
        49
    """
    z = {0.9: 1.645, 0.95: 1.96, 0.99: 2.576}.get(round(confidence, 2), 1.96)
    half = margin_pct / 2
    return max(MIN_STEPS, math.ceil((z * 1.25 * math.sqrt(2) * cv_pct / half) ** 2))
