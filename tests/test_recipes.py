"""The main job (`recipes/rmsnorm.py`) end to end, as the README runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]


def _run_recipe(tracking_uri: str, variants: str, experiment: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes" / "rmsnorm.py"),
            "--rows",
            "8",
            "--hidden",
            "32",
            "--warmup",
            "1",
            "--active",
            "2",
            "--backend",
            "cpu",
            "--variants",
            variants,
            "--experiment",
            experiment,
        ],
        capture_output=True,
        text=True,
        env={"MLFLOW_TRACKING_URI": tracking_uri, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _children(client: MlflowClient, experiment: str) -> tuple[str, dict[str, str]]:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {
        r.info.run_name: r.info.run_id
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    return parent.info.run_id, children


def test_rmsnorm_recipe_naive_and_fused(tracking_uri) -> None:
    out = _run_recipe(tracking_uri, "naive,rms_norm", "recipe-fast")
    assert "| naive | n/a |" in out and "| rms_norm | n/a |" in out
    client = MlflowClient(tracking_uri)
    parent, children = _children(client, "recipe-fast")
    assert set(children) == {"naive", "rms_norm"}
    assert client.get_run(children["naive"]).data.metrics["profile/op_calls"] == 6
    assert client.get_run(children["rms_norm"]).data.metrics["profile/op_calls"] == 1
    parent_metrics = client.get_run(parent).data.metrics
    assert parent_metrics["comparison/naive/op_calls"] == 6
    assert "comparison.md" in [a.path for a in client.list_artifacts(parent)]


@pytest.mark.slow
def test_rmsnorm_recipe_all_three_variants(tracking_uri) -> None:
    _run_recipe(tracking_uri, "naive,rms_norm,compiled", "recipe-all")
    client = MlflowClient(tracking_uri)
    _, children = _children(client, "recipe-all")
    assert set(children) == {"naive", "rms_norm", "compiled"}
    assert client.get_run(children["compiled"]).data.metrics["profile/op_calls"] <= 2


def test_train_recipe_profiles_train_and_validate(tracking_uri) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes" / "train.py"),
            "--steps",
            "8",
            "--batch-size",
            "4",
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "2",
            "--backend",
            "cpu",
            "--experiment",
            "train-recipe",
        ],
        capture_output=True,
        text=True,
        env={"MLFLOW_TRACKING_URI": tracking_uri, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("train-recipe")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.metrics["profile/train/steps"] == 2
    assert run.data.metrics["profile/validate/steps"] == 2
    assert "train_loss" in run.data.metrics and "val_loss" in run.data.metrics
