"""A/A and A/B in separate processes (benchmarks/compare_noise.py with fewer runs)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_compare_tells_a_real_change_from_noise(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location(
        "compare_noise", ROOT / "benchmarks/compare_noise.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.run_benchmark(
        3, 96, f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "spool")
    )
    aa, ab, small = result["aa"], result["ab"], result["small"]
    assert aa["pairs"] == 6 and aa["regressions"] <= 1, aa
    assert ab["pairs"] == 6 and ab["regressions"] >= 5, ab
    assert ab["marked_mm"] == ab["regressions"] and "aten::mm" in ab["marked"], ab
    # One run a side: a 1.05x change is never a regression at --fail-above 10 when processes
    # run alike; on a busy 2-core host one fresh process can run 15-25 % slower than another
    # with the same code (docs/comparing.md), which no per-step statistic can see. Several
    # runs a side, pooled (the documented remedy), must never call it a regression.
    pooled = result["small_pooled"]
    assert pooled["verdict"] != "regression" and pooled["exit"] != 1, pooled
    assert small["regressions"] <= 3, small  # at most one of the 3 runs slower on its own
