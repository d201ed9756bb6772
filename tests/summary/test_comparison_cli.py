"""`neuron-mlflow compare --html PATH --log-to RUN`: comparison.html and comparison.md."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.summary.comparison import RunProfile, compare_profiles
from neuron_mlflow.summary.comparison_html import render_comparison_html
from tests.helpers import inputs, rmsnorm_fused, rmsnorm_naive


@pytest.fixture(scope="module")
def runs(tracking_uri: str) -> dict[str, str]:
    """Two profiled runs (naive, fused RMSNorm) and a parent run for the comparison files,
    in the test run's shared store."""
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("compare-html")
    x, w = inputs()
    ids = {}
    for name, fn in (("naive", rmsnorm_naive), ("fused", rmsnorm_fused)):
        with mlflow.start_run(run_name=name) as run:
            profiled = nm.profile(backend="cpu", schedule=nm.Schedule(warmup=1, active=2))(fn)
            for _ in range(3):
                profiled(x, w)
            profiled.profiler.session.wait(60)
            profiled.profiler.close()  # else its request poller queries the store till exit
            ids[name] = run.info.run_id
    with mlflow.start_run(run_name="parent") as parent:
        ids["parent"] = parent.info.run_id
    mlflow.set_tracking_uri(None)
    return ids


def test_html_and_log_to_write_both_files(runs, tmp_path: Path, capsys) -> None:
    page = tmp_path / "out" / "comparison.html"
    code = main(
        [
            "compare",
            runs["naive"],
            runs["fused"],
            "--html",
            str(page),
            "--log-to",
            runs["parent"],
            "--format",
            "json",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays the comparison alone
    assert f"wrote {page}" in captured.err
    text = page.read_text()
    assert "aten::mul" in text and "naive" in text and "fused" in text
    client = MlflowClient()
    assert {a.path for a in client.list_artifacts(runs["parent"])} >= {
        "comparison.html",
        "comparison.md",
    }
    md = Path(client.download_artifacts(runs["parent"], "comparison.md", str(tmp_path)))
    lines = md.read_text().splitlines()
    assert lines[0].startswith("Result: ") and lines[0].endswith(
        "(self CPU time, 10th-percentile step)"
    )
    header = lines.index(
        "| variant | device time (us) | self CPU (us) | op calls | wall time (us) "
        "| self CPU time vs baseline | verdict |"
    )
    assert lines[header + 2].startswith("| naive | n/a |")
    assert lines[header + 2].endswith("| baseline | - |")
    assert lines[header + 3].startswith("| fused | n/a |")
    assert any(line.startswith("| aten::mul |") for line in lines)


def test_the_verdict_of_fail_above_is_on_the_page(runs, tmp_path: Path) -> None:
    page = tmp_path / "gate.html"
    code = main(["compare", runs["fused"], runs["naive"], "--fail-above", "0", "--html", str(page)])
    text = page.read_text()  # 2 steps a side: the gate cannot decide, and says so
    assert code == 3
    assert 'class="verdict insufficient"' in text and "insufficient data" in text
    allowed = ["--fail-above", "0", "--allow-insufficient"]
    assert main(["compare", runs["fused"], runs["naive"], *allowed]) == 0


def _steps(mean: float, windows: int = 3, steps: int = 10) -> list[list[float]]:
    return [
        [mean * (1 + 0.01 * ((i * 7 + w) % 5 - 2)) for i in range(steps)] for w in range(windows)
    ]


def test_verdicts_pass_and_fail() -> None:
    base = RunProfile(
        "a", "naive", "p", {"cpu_time_us": 100.0}, {}, samples=[{"cpu_time_us": _steps(100.0)}]
    )
    slower = RunProfile(
        "b", "slow", "p", {"cpu_time_us": 130.0}, {}, samples=[{"cpu_time_us": _steps(130.0)}]
    )
    failing = render_comparison_html(
        compare_profiles([base, slower], margin_pct=10), fail_above_pct=10.0
    )
    assert 'class="verdict fail"' in failing and "the whole interval is above 1.10" in failing
    assert 'data-what="cpu_time_us" data-run="slow" data-verdict="regression"' in failing
    passing = render_comparison_html(
        compare_profiles([base, slower], margin_pct=40), fail_above_pct=40.0
    )
    assert 'class="verdict pass"' in passing and "The gate passes" in passing
    assert 'data-verdict="no change"' in passing
    assert "nm-verdict" not in render_comparison_html(compare_profiles([base, slower]))


def test_log_to_an_unknown_run_is_bad_usage(runs, capsys) -> None:
    code = main(["compare", runs["naive"], runs["fused"], "--log-to", "nope"])
    assert code == 2 and "--log-to: run 'nope' was not found" in capsys.readouterr().err


def test_deltas_are_colour_coded_against_the_baseline() -> None:
    base = RunProfile(
        "a",
        "naive",
        "p",
        {"cpu_time_us": 100.0},
        {"aten::mul": {"self_cpu_us": 60.0}, "aten::add": {"self_cpu_us": 5.0}},
    )
    other = RunProfile(
        "b",
        "fused",
        "p",
        {"cpu_time_us": 150.0},
        {"aten::mul": {"self_cpu_us": 20.0}, "aten::_fused": {"self_cpu_us": 9.0}},
    )
    text = render_comparison_html(compare_profiles([base, other]))
    assert 'class="cmp-bar bad" data-run="fused" data-title="self CPU time per step"' in text
    assert 'class="cmp-bar good" data-run="fused" data-title="aten::mul"' in text
    assert "[gone]" in text and "[new]" in text and "+50.0%" in text and "-66.7%" in text
