"""The statistics of `compare` on synthetic samples with known answers."""

from __future__ import annotations

import random

import pytest

from neuron_mlflow.summary.statistics import (
    IMPROVEMENT,
    INSUFFICIENT,
    NO_CHANGE,
    REGRESSION,
    compare_samples,
    first_step_outlier,
    kept_steps,
    steps_needed,
)


def _side(
    mean: float,
    runs: int = 1,
    windows: int = 3,
    steps: int = 20,
    cv: float = 0.05,
    seed: int = 0,
    run_spread: float = 0.0,
) -> list[list[list[float]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(runs):
        level = mean * (1 + rng.uniform(-run_spread, run_spread))
        out.append([[rng.gauss(level, cv * level) for _ in range(steps)] for _ in range(windows)])
    return out


def test_equal_distributions_are_no_change() -> None:
    for seed in range(5):
        e = compare_samples(_side(100, seed=seed), _side(100, seed=seed + 100), margin_pct=10)
        assert e.verdict == NO_CHANGE, e
        assert e.low <= 1.0 <= e.high or abs(e.ratio - 1) < 0.05


def test_a_known_shift_is_a_regression_whose_interval_holds_it() -> None:
    e = compare_samples(_side(100, seed=1), _side(130, seed=2), margin_pct=10)
    assert e.verdict == REGRESSION
    assert e.low > 1.1 and e.low <= 1.3 <= e.high
    assert e.ratio == pytest.approx(1.3, rel=0.05)
    assert e.interval_text().startswith("1.")


def test_a_known_speedup_is_an_improvement() -> None:
    e = compare_samples(_side(100, seed=3), _side(41, seed=4))
    assert e.verdict == IMPROVEMENT and e.high < 1 / 1.05
    assert e.ratio == pytest.approx(0.41, rel=0.05)


def test_a_small_change_is_not_a_regression_at_a_larger_margin() -> None:
    e = compare_samples(_side(100, seed=5), _side(105, seed=6), margin_pct=10)
    assert e.verdict in (NO_CHANGE, INSUFFICIENT)
    assert e.verdict != REGRESSION


def test_heavy_outliers_do_not_decide() -> None:
    rng = random.Random(7)
    base = _side(100, seed=8)
    cand = _side(100, seed=9)
    for run in cand:  # a busy neighbour: a quarter of the steps take 10x
        for window in run:
            for i in rng.sample(range(len(window)), len(window) // 4):
                window[i] *= 10
    e = compare_samples(base, cand, margin_pct=10)
    assert e.verdict == NO_CHANGE, e
    mean_ratio = sum(sum(w) for r in cand for w in r) / sum(sum(w) for r in base for w in r)
    assert mean_ratio > 2  # what the per-window mean would have said


def test_a_single_sample_is_insufficient_data() -> None:
    e = compare_samples([[[5.0]]], [[[50.0]]], margin_pct=10)
    assert e.verdict == INSUFFICIENT and "too few samples" in e.reason
    assert e.ratio == pytest.approx(10.0)
    assert compare_samples([], [[[1.0]]]).verdict == INSUFFICIENT
    assert compare_samples([[[0.0] * 6]], [[[1.0] * 6]]).verdict == INSUFFICIENT


def test_three_windows_without_steps_are_enough() -> None:
    """Old runs: one value (the window's mean) per window."""
    e = compare_samples([[[100.0], [101.0], [99.0]]], [[[200.0], [199.0], [202.0]]])
    assert e.verdict == REGRESSION and e.steps == (3, 3)


def test_run_to_run_noise_counts() -> None:
    """Runs that differ by up to +-25 % between them: a 1.15x shift is no longer certain."""
    base = _side(100, runs=3, run_spread=0.25, seed=10, cv=0.01)
    cand = _side(115, runs=3, run_spread=0.25, seed=11, cv=0.01)
    noisy = compare_samples(base, cand, margin_pct=10)
    flat = compare_samples(
        [[w for r in base for w in r]], [[w for r in cand for w in r]], margin_pct=10
    )
    assert noisy.verdict == INSUFFICIENT
    assert (noisy.high - noisy.low) > 1.5 * (flat.high - flat.low)
    assert noisy.runs == (3, 3) and noisy.windows == (9, 9)


def test_the_first_step_is_left_out_only_when_it_is_an_outlier() -> None:
    assert first_step_outlier([5000.0, 100, 101, 99, 100, 102])
    assert not first_step_outlier([101.0, 100, 101, 99, 100, 102])
    assert kept_steps([5000.0, 100, 101, 99, 100, 102]) == [100, 101, 99, 100, 102]
    assert kept_steps([5000.0, 100, 101]) == [5000.0, 100, 101]  # too few others: kept
    cold = [[[10 * 100.0] + [100.0 + i % 3 for i in range(9)] for _ in range(3)]]
    warm = [[[100.0 + i % 3 for i in range(10)] for _ in range(3)]]
    assert compare_samples(warm, cold).verdict == NO_CHANGE


def test_deterministic() -> None:
    a, b = _side(100, seed=12), _side(104, seed=13)
    assert compare_samples(a, b, name="x") == compare_samples(a, b, name="x")


def test_steps_needed_grows_with_noise() -> None:
    assert steps_needed(5, 10) < steps_needed(20, 10)
    assert steps_needed(1, 50) == 5


def test_an_interval_across_the_margin_is_too_close_to_call_and_the_answer_says_so() -> None:
    from neuron_mlflow.summary.comparison import RunProfile, compare_profiles, decide

    e = compare_samples(_side(100, seed=8, cv=0.01), _side(95.2, seed=9, cv=0.01))
    assert e.verdict == INSUFFICIENT and e.low < 1 / 1.05 < e.high
    assert "crosses an edge of [0.952, 1.050] (+-5%): too close to call" in e.reason

    def run(run_id: str, name: str, mean: float, seed: int) -> RunProfile:
        steps = _side(mean, seed=seed, cv=0.01)
        return RunProfile(run_id, name, "p", {"cpu_time_us": mean}, {},
                          samples=[{"cpu_time_us": steps[0]}])  # fmt: skip

    result = decide(compare_profiles([run("a", "naive", 100, 8), run("b", "fused", 95.2, 9)]))
    assert result.result == "no winner: insufficient data, too close to call (fused vs naive)"
    assert "crosses an edge of [0.952, 1.050]" in result.detail  # the result_detail tag
