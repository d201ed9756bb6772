"""The main job (`recipes/rmsnorm.py`) end to end, as the README runs it."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, parent_and_children, run_python


def _run_recipe(tracking_uri: str, variants: str, experiment: str) -> str:
    args = ["--rows", "8", "--hidden", "32", "--warmup", "1", "--active", "2", "--repeat", "3"]
    args += ["--backend", "cpu"]
    return run_python(
        [
            str(ROOT / "recipes" / "rmsnorm.py"),
            *args,
            "--variants",
            variants,
            "--experiment",
            experiment,
        ],
        tracking_uri,
    )


@pytest.mark.slow
def test_rmsnorm_recipe_naive_and_fused(tracking_uri) -> None:
    out = _run_recipe(tracking_uri, "naive,rms_norm", "recipe-fast")
    assert "| naive | n/a |" in out and "| rms_norm | n/a |" in out
    client = MlflowClient(tracking_uri)
    parent, children = parent_and_children(client, "recipe-fast")
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
    _, children = parent_and_children(client, "recipe-all")
    assert set(children) == {"naive", "rms_norm", "compiled"}
    assert client.get_run(children["compiled"]).data.metrics["profile/op_calls"] <= 2


@pytest.mark.slow
@pytest.mark.parametrize("under_mlflow_run", [False, True])
def test_train_recipe_profiles_train_and_validate(tracking_uri, under_mlflow_run) -> None:
    args = ["--steps", "8", "--batch-size", "4", "--wait", "1", "--warmup", "1", "--active", "2"]
    client = MlflowClient(tracking_uri)
    name = f"train-recipe-{under_mlflow_run}"
    env = {}
    if under_mlflow_run:  # `mlflow run` makes the run (and its name) and passes its id
        made = client.create_run(client.create_experiment(name), run_name="bold-gnat-951")
        env["MLFLOW_RUN_ID"] = made.info.run_id
    out = run_python(
        [str(ROOT / "recipes" / "train.py"), *args, "--backend", "cpu", "--experiment", name],
        tracking_uri,
        **env,
    )
    experiment = client.get_experiment_by_name(name)
    (run,) = client.search_runs([experiment.experiment_id])
    assert f"; run {run.info.run_name!r} ({run.info.run_id})" in out, out  # the name it has
    assert run.data.metrics["profile/train/steps"] == 2
    assert run.data.metrics["profile/validate/steps"] == 2
    assert "train_loss" in run.data.metrics and "val_loss" in run.data.metrics


@pytest.mark.slow
def test_the_compare_entry_point_gives_the_jobs_verdicts(tracking_uri) -> None:
    """`mlflow run . -e compare` with its defaults: the job's own verdicts, no gate (its
    default once made every verdict "no change": the gate is also the verdicts' margin)."""
    import shlex

    import yaml

    _run_recipe(tracking_uri, "naive,rms_norm", "recipe-compare")
    entry = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]["compare"]
    values = {name: spec["default"] for name, spec in entry["parameters"].items()}
    values["experiment"] = "recipe-compare"
    command = shlex.split(entry["command"].format(**values))
    assert command[0] == "python"
    out = run_python(command[1:], tracking_uri)
    client = MlflowClient(tracking_uri)
    parent, _ = parent_and_children(client, "recipe-compare")
    result = client.get_run(parent).data.tags["result"]  # the job's one answer
    assert out.startswith(f"Result: {result} ("), (result, out[:300])
