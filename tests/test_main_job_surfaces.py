"""One answer on every surface: the main job once, then every place that shows its comparison.

The recipe's printed lines and table, the parent run's tags and metrics (``result``,
``fastest``, ``speedup``, ``verdict/<variant>``, ``ratio/<variant>``), ``comparison.md``,
``comparison.html`` and ``neuron-mlflow compare --format json`` on the same runs must give
each variant the same ratio and verdict, and name the same winner (or none).
"""

from __future__ import annotations

import html
import json
import re
import tempfile
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, parent_and_children, run_python

STATISTIC = "self CPU time, 10th-percentile step"


@pytest.mark.slow
def test_every_surface_gives_the_same_ratio_verdict_and_winner(tracking_uri) -> None:
    variants = ["naive", "rms_norm", "compiled"]
    out = run_python(
        [
            str(ROOT / "recipes" / "rmsnorm.py"),
            *("--rows", "64", "--hidden", "256", "--warmup", "2", "--active", "8"),
            *("--repeat", "2", "--backend", "cpu", "--variants", ",".join(variants)),
            *("--experiment", "surfaces"),
        ],
        tracking_uri,
    )
    client = MlflowClient(tracking_uri)
    parent_id, children = parent_and_children(client, "surfaces")
    parent = client.get_run(parent_id).data
    base = variants[0]

    # the compare command on the same runs: the reference
    compared = json.loads(
        run_python(
            [
                "-m",
                "neuron_mlflow.cli",
                "compare",
                *(children[v] for v in variants),
                "--format",
                "json",
            ],
            tracking_uri,
        )
    )
    assert compared["statistic"] == STATISTIC
    # the parent run given by hand stands for its variants, naive the baseline: the same answer
    by_parent = json.loads(
        run_python(
            ["-m", "neuron_mlflow.cli", "compare", parent_id, "--format", "json"], tracking_uri
        )
    )
    assert by_parent["estimates"] == compared["estimates"]
    assert by_parent["outcome"] == compared["outcome"]
    expected = {}
    for variant in variants[1:]:
        e = compared["estimates"][children[variant]][compared["time_metric"]]
        expected[variant] = (f"{e['ratio']:.2f}x", e["verdict"])

    tmp = tempfile.mkdtemp()
    md = Path(client.download_artifacts(parent_id, "comparison.md", tmp)).read_text()
    page = html.unescape(
        Path(client.download_artifacts(parent_id, "comparison.html", tmp)).read_text()
    )
    for variant, (ratio, verdict) in expected.items():
        # printed lines
        line = next(x for x in out.splitlines() if x.startswith(f"{variant} vs {base}: "))
        assert line.startswith(f"{variant} vs {base}: {ratio}") and f", {verdict}" in line
        assert line.endswith(f"({STATISTIC})")
        # the printed table and comparison.md: the same seed table
        row = next(x for x in md.splitlines() if x.startswith(f"| {variant} |"))
        assert row in out
        assert row.endswith(f"| {verdict} |") and f"| {ratio}" in row
        # tags and metrics
        assert parent.tags[f"verdict/{variant}"] == verdict
        assert f"{parent.metrics[f'ratio/{variant}']:.2f}x" == ratio
        # comparison.html's table of how sure
        found = re.search(
            rf'<tr data-verdict="([^"]+)"><td>cpu_time_us</td><td>{variant}</td><td>([^<]+)</td>',
            page,
        )
        assert found is not None, variant
        assert found.group(1) == verdict and found.group(2).startswith(ratio)

    # one winner or none, everywhere
    outcome = compared["outcome"]
    assert parent.tags["result"] == outcome["result"]
    assert parent.tags["statistic"] == STATISTIC
    assert f"Result: {outcome['result']} ({STATISTIC})" in md
    assert outcome["result"] in page and STATISTIC in page
    assert f"{outcome['result']} ({STATISTIC}); parent run" in out
    if outcome["fastest"] is None:
        assert "fastest" not in parent.tags and "speedup" not in parent.metrics
        assert outcome["result"].startswith("no winner: ")
    else:
        assert parent.tags["fastest"] == outcome["fastest"]
        assert parent.metrics["speedup"] == pytest.approx(outcome["speedup"], abs=1e-3)
    # the headline a variant's value: the same number in the table, the metrics and compare
    for variant in variants:
        value = compared["values"][children[variant]]["cpu_time_us"]
        assert parent.metrics[f"comparison/{variant}/cpu_time_us"] == pytest.approx(value)
        row = next(x for x in md.splitlines() if x.startswith(f"| {variant} |"))
        assert f"| {value:.1f} |" in row
