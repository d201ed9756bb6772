"""Runs that say what they are, and a quiet terminal: the recipes as a newcomer runs them.

The parent run is named after what it compared and when; its headline (``result`` and,
with a decided winner, the ``fastest`` tag and ``speedup`` metric) is there to be added as a
runs-list column; the job's own output is a line per round and a summary that says how to
open the UI.
"""

from __future__ import annotations

import re

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, parent_and_children, run_python

WHEN = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}"


@pytest.mark.slow
def test_rmsnorm_parent_run_is_named_and_carries_the_headline(tracking_uri) -> None:
    out = run_python(
        [
            str(ROOT / "recipes" / "rmsnorm.py"),
            *("--rows", "8", "--hidden", "32", "--warmup", "1", "--active", "2", "--repeat", "2"),
            *("--backend", "cpu", "--variants", "naive,rms_norm", "--experiment", "named"),
        ],
        tracking_uri,
    )
    client = MlflowClient(tracking_uri)
    parent_id, children = parent_and_children(client, "named")
    parent = client.get_run(parent_id)
    assert re.fullmatch(rf"rmsnorm naive\|rms_norm {WHEN}", parent.info.run_name)
    assert set(children) == {"naive", "rms_norm"}
    result = parent.data.tags["result"]
    assert len(result) <= 80, result  # readable in the runs list's column
    if "fastest" in parent.data.tags:  # a decided winner only
        fastest = parent.data.tags["fastest"]
        assert fastest in children
        assert result.startswith(f"{fastest} fastest: ")
        assert parent.data.metrics["speedup"] >= 1.0
    else:
        assert result.startswith("no winner: ") and "speedup" not in parent.data.metrics
    assert parent.data.tags["statistic"] == "self CPU time, 10th-percentile step"
    assert parent.data.tags["result_detail"].startswith(parent.data.tags["statistic"])

    lines = out.strip().splitlines()
    assert len(lines) <= 20, out
    assert lines[0].startswith("round 1/2: ") and lines[1].startswith("round 2/2: ")
    assert {lines[0][len("round 1/2: ") :], lines[1][len("round 2/2: ") :]} <= {
        "naive, rms_norm",
        "rms_norm, naive",
    }
    experiment = client.get_experiment_by_name("named").experiment_id
    assert lines[-1] == (
        f"See it in the UI: mlflow ui --backend-store-uri {tracking_uri}, then open "
        f"http://127.0.0.1:5000/#/experiments/{experiment}/runs"
    )


@pytest.mark.slow
def test_train_run_is_named_and_carries_the_headline(tracking_uri) -> None:
    out = run_python(
        [
            str(ROOT / "recipes" / "train.py"),
            *("--steps", "6", "--batch-size", "4", "--wait", "1", "--warmup", "1"),
            *("--active", "2", "--backend", "cpu", "--experiment", "train-named"),
        ],
        tracking_uri,
    )
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("train-named").experiment_id
    (run,) = client.search_runs([experiment])
    assert re.fullmatch(rf"train TinyTransformer 6 steps {WHEN}", run.info.run_name)
    assert re.fullmatch(
        r"train \d+\.\d ms/step, validate \d+\.\d ms/step \(wall\)", run.data.tags["result"]
    )
    assert run.data.metrics["train_step_ms"] > 0
    lines = out.strip().splitlines()
    assert len(lines) <= 15, out
    assert lines[-1].endswith(f"#/experiments/{experiment}/runs")
