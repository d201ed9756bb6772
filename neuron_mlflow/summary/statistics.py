"""How sure a comparison is: the ratio candidate / baseline, a seeded bootstrap interval and a
verdict; the method: ``docs/comparing.md``.

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
from dataclasses import dataclass, replace

REGRESSION, IMPROVEMENT = "regression", "improvement"
NO_CHANGE, INSUFFICIENT = "no change", "insufficient data"
DEFAULT_MARGIN_PCT = 5.0
"""The margin of the verdicts when no ``--fail-above`` is given (percent)."""
CONFIDENCE = 0.95
"""Confidence level of the intervals (per-op intervals: Bonferroni, see ``compare``)."""
RESAMPLES = 2000
"""Bootstrap replicates (more when a corrected level needs deeper tails)."""
STEP_POOL = 400
"""Bootstrap replicates of each run's value, drawn once per run."""
QUANTILE = 0.1
"""The statistic: this quantile of a run's steps (p10; why: ``docs/comparing.md``)."""
MIN_STEPS = 5
"""Kept steps a side needs (over all its windows) for a verdict ..."""
MIN_WINDOWS = 3
"""... unless it has at least this many windows (old runs: one value per window)."""
OUTLIER_FENCE = 1.5
"""Tukey's fence for the first step: ``Q1 - 1.5 IQR`` .. ``Q3 + 1.5 IQR`` of the others."""
SEED = 20240523
DISTURBED_WAIT_SHARE = 0.05
"""A step is disturbed when this process's threads waited for a CPU for at least this share
of its wall time (:func:`disturbed`)."""
MAX_DISTURBED_SHARE = 0.5
"""A side with more than this share of its steps disturbed gets no verdict (``compare``)."""
STATISTIC = "10th-percentile step"
"""What every surface of a comparison shows: per run, the :data:`QUANTILE` quantile of its
undisturbed steps, all windows pooled (a side: the mean over its runs)."""

Side = Sequence[Sequence[Sequence[float]]]
"""One side: runs -> windows -> per-step values."""


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1), linear between order statistics (not ``numpy.quantile``: it
    differs in the last bit).

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
    """Q3 - Q1.

    Example:
        >>> iqr([1.0, 2.0, 3.0, 4.0, 5.0])
        2.0
    """
    return quantile(values, 0.75) - quantile(values, 0.25)


def disturbed(wall_us: float, cpu_wait_us: float | None, switches: int | None) -> bool | None:
    """Whether other processes disturbed a step: this process's threads waited for a CPU at
    least :data:`DISTURBED_WAIT_SHARE` of the step's wall time (``cpu_wait_us``, Linux); where
    the wait is unknown, any involuntary context switch; ``None`` when neither is known.
    Measured: ``neuron_mlflow/capture/interference.py``.

    Example:
        >>> disturbed(27000.0, 31000.0, 8), disturbed(200.0, 0.0, 0), disturbed(200.0, None, 1)
        (True, False, True)
        >>> disturbed(200.0, None, None) is None
        True
    """
    if cpu_wait_us is not None:
        return cpu_wait_us >= DISTURBED_WAIT_SHARE * wall_us and cpu_wait_us > 0
    if switches is not None:
        return switches > 0
    return None


def first_step_outlier(values: Sequence[float]) -> bool:
    """True when the first step of a window lies outside Tukey's fences of its other steps
    (the first step rule of ``docs/comparing.md``)."""
    rest = list(values[1:])
    if len(rest) < 4:
        return False
    q1, q3 = quantile(rest, 0.25), quantile(rest, 0.75)
    spread = max(q3 - q1, 0.01 * abs(median(rest)))
    return not (q1 - OUTLIER_FENCE * spread <= values[0] <= q3 + OUTLIER_FENCE * spread)


def kept_steps(values: Sequence[float]) -> list[float]:
    """The steps of one window that comparisons use: all but an outlying first step."""
    return list(values[1:]) if first_step_outlier(values) else list(values)


@dataclass(frozen=True)
class Estimate:
    """The comparison of one metric: ratio candidate / baseline (``None`` without data on a
    side or with a baseline of 0), its interval (``None`` also with too few samples), verdict
    and reason; ``baseline``, ``candidate``: each side's :func:`side_value`; ``steps``,
    ``windows``, ``runs``: per side (a run whose every step was disturbed counts).
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
    runs = [[kept_steps([float(v) for v in w]) for w in run if len(w)] for run in side]
    return [run for run in runs if run]


def side_value(side: Side) -> float | None:
    """The mean over its runs of the :data:`QUANTILE` quantile of each run's kept steps;
    ``None`` without samples.

    Example:
        >>> side_value([[[100.0, 101, 99, 100, 102]], [[110.0, 111, 109, 110, 112]]])
        104.4
        >>> side_value([[[500.0] * 20, [400.0] * 20, [402.0] * 20]])  # one slow window
        400.0
    """
    runs = _clean(side)
    return _mean_value(runs) if runs else None


def _mean_value(runs: list[list[list[float]]]) -> float:
    return sum(quantile([v for w in run for v in w], QUANTILE) for run in runs) / len(runs)


def _pools(runs: list[list[list[float]]], rng: random.Random) -> list[list[float]]:
    """Per run: :data:`STEP_POOL` bootstrap replicates of its value, steps drawn with
    replacement inside each window; windows of one value (old runs) pooled into one stratum."""
    out = []
    for run in runs:
        singles = [w[0] for w in run if len(w) == 1]
        strata = [w for w in run if len(w) > 1] + ([singles] if singles else [])
        pool = []
        for _ in range(STEP_POOL):
            drawn = [v for stratum in strata for v in rng.choices(stratum, k=len(stratum))]
            pool.append(quantile(drawn, QUANTILE))
        out.append(pool)
    return out


def _replicate(pools: list[list[float]], rng: random.Random) -> float:
    """One bootstrap replicate of a side: its runs drawn with replacement, each a replicate."""
    choice = rng.choice
    return sum(choice(choice(pools)) for _ in pools) / len(pools)


def compare_samples(
    baseline: Side,
    candidate: Side,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    confidence: float = CONFIDENCE,
    name: str = "",
    resamples: int = RESAMPLES,
) -> Estimate:
    """Ratio, interval at level ``confidence`` and verdict at ``margin_pct`` of two sides; the
    bootstrap is seeded from :data:`SEED` and ``name`` (the metric): its own draws per metric.

    Example:
        >>> same = [[[10.0, 10.2, 9.9, 10.1, 10.0, 9.8]], [[10.1, 9.9, 10.0, 10.2, 10.1, 9.9]]]
        >>> compare_samples(same, same).verdict
        'no change'
    """
    base, cand = _clean(baseline), _clean(candidate)
    steps = (sum(len(w) for run in base for w in run), sum(len(w) for run in cand for w in run))
    windows = (sum(map(len, base)), sum(map(len, cand)))
    base_value = _mean_value(base) if base else None
    cand_value = _mean_value(cand) if cand else None

    runs = (len(baseline), len(candidate))  # a run without kept steps counts here too
    found = Estimate(
        INSUFFICIENT, None, None, None, base_value, cand_value, steps, windows, runs, confidence, ""
    )
    if base_value is None or cand_value is None:
        missing = "baseline" if base_value is None else "candidate"
        return replace(found, reason=f"no samples on the {missing} side")
    if base_value <= 0:
        return replace(found, reason="the baseline is 0: no ratio")
    ratio = cand_value / base_value
    tail = (1.0 - confidence) / 2
    rng = random.Random(SEED ^ zlib.crc32(name.encode("utf-8")))
    pools = [_pools(base, rng), _pools(cand, rng)]
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
        return replace(found, ratio=ratio, reason=reason)
    if low > upper:
        verdict, reason = REGRESSION, f"the whole interval is above {upper:.3f}"
    elif high < lower:
        verdict, reason = IMPROVEMENT, f"the whole interval is below {lower:.3f}"
    elif lower <= low and high <= upper:
        verdict, reason = NO_CHANGE, f"the whole interval is within {band}"
    else:
        verdict = INSUFFICIENT
        reason = (
            f"the interval [{low:.3f}, {high:.3f}] crosses an edge of {band} "
            f"(+-{margin_pct:g}%): too close to call"
        )
    return replace(found, verdict=verdict, ratio=ratio, low=low, high=high, reason=reason)


def steps_needed(cv_pct: float, margin_pct: float, confidence: float = CONFIDENCE) -> int:
    """Rough steps a side needs so that noise of ``cv_pct`` (the steps' coefficient of
    variation) gives an interval within ``margin_pct`` / 2 either side: the median of ``n``
    steps has a standard error of about ``1.25 sigma / sqrt(n)``, a ratio ``sqrt(2)`` times that.

    Example:
        >>> steps_needed(10.0, 10.0)
        49
    """
    z = {0.9: 1.645, 0.95: 1.96, 0.99: 2.576}.get(round(confidence, 2), 1.96)
    half = margin_pct / 2
    return max(MIN_STEPS, math.ceil((z * 1.25 * math.sqrt(2) * cv_pct / half) ** 2))
