"""`compare` picks the runs users mean: a job (a parent run with its nested variant runs) is
one job for `--last K`, compared variant by variant; a parent run id given by hand stands for
its variants; the output says which runs each side holds."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from tests.helpers import ROOT, parent_and_children, run_python

PARENT = "mlflow.parentRunId"
_clock = [int(time.time() * 1000)]


def _now() -> int:
    """Start times one second apart, in the order runs are made here (unless told)."""
    _clock[0] += 1000
    return _clock[0]


def _experiment(client: MlflowClient) -> str:
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    client.create_experiment(name)
    return name


def _profiled(client: MlflowClient, run_id: str, cpu: float) -> None:
    client.log_metric(run_id, "profile/op_calls", 2.0)
    client.log_metric(run_id, "profile/cpu_time_us", cpu)


def _plain(client: MlflowClient, experiment: str, cpu: float, name: str = "plain") -> str:
    exp = client.get_experiment_by_name(experiment).experiment_id
    run_id = client.create_run(exp, run_name=name, start_time=_now()).info.run_id
    _profiled(client, run_id, cpu)
    return run_id


def _job(
    client: MlflowClient,
    experiment: str,
    variants: dict[str, float],
    starts: list[int] | None = None,
) -> tuple[str, dict[str, str]]:
    """A parent run with one nested, profiled run per variant (created in ``variants`` order,
    started at ``starts`` when given); returns (parent id, variant -> run id)."""
    exp = client.get_experiment_by_name(experiment).experiment_id
    base = _now()
    parent = client.create_run(exp, run_name="job", start_time=base).info.run_id
    children = {}
    for number, (variant, cpu) in enumerate(variants.items()):
        start = base + (starts[number] if starts else number + 1)
        child = client.create_run(
            exp, run_name=variant, start_time=start, tags={PARENT: parent}
        ).info.run_id
        _profiled(client, child, cpu)
        children[variant] = child
    _clock[0] = base + 500
    return parent, children


def _json(capsys, *argv: str) -> dict:
    assert main(["compare", *argv, "--format", "json"]) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    return data


def _sides(data: dict) -> list[tuple[str, list[str]]]:
    return [(r["name"], r["run_ids"]) for r in data["runs"]]


def test_last_counts_jobs_and_pools_each_variant_across_them(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    _job(client, experiment, {"naive": 10.0, "rms_norm": 8.0})  # the oldest: left out
    _, b = _job(client, experiment, {"naive": 11.0, "rms_norm": 7.0})
    _, c = _job(client, experiment, {"naive": 13.0, "rms_norm": 9.0})
    data = _json(capsys, "--experiment", experiment, "--last", "2")
    assert _sides(data) == [
        ("naive", [b["naive"], c["naive"]]),
        ("rms_norm", [b["rms_norm"], c["rms_norm"]]),
    ]
    assert data["baseline"] == b["naive"]
    naive, fused = data["runs"]
    assert naive["headline"]["cpu_time_us"] == pytest.approx(12.0)  # the two jobs' mean
    assert fused["headline"]["cpu_time_us"] == pytest.approx(8.0)
    # the table says on stderr which runs each side holds
    assert main(["compare", "--experiment", experiment, "--last", "2"]) == 0
    err = capsys.readouterr().err
    assert f"compared: naive (baseline) = runs {b['naive'][:8]}, {c['naive'][:8]}\n" in err
    assert f"compared: rms_norm = runs {b['rms_norm'][:8]}, {c['rms_norm'][:8]}\n" in err
    # the latest job alone: its two variants
    data = _json(capsys, "--experiment", experiment, "--last", "1")
    assert _sides(data) == [("naive", [c["naive"]]), ("rms_norm", [c["rms_norm"]])]


def test_the_baseline_is_the_variant_that_started_first(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    # made in this order, but `zeta` started first: it is the job's first variant
    _, runs = _job(client, experiment, {"alpha": 5.0, "zeta": 6.0}, starts=[20, 10])
    data = _json(capsys, "--experiment", experiment, "--last", "1")
    assert _sides(data) == [("zeta", [runs["zeta"]]), ("alpha", [runs["alpha"]])]
    assert data["baseline"] == runs["zeta"]


def test_a_plain_profiled_run_is_a_job_of_its_own(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    old = _plain(client, experiment, 10.0, name="old")
    _, job = _job(client, experiment, {"naive": 11.0, "rms_norm": 7.0})
    new = _plain(client, experiment, 12.0, name="new")
    exp = client.get_experiment_by_name(experiment).experiment_id
    client.create_run(exp, run_name="no profile", start_time=_now())  # not a job
    data = _json(capsys, "--experiment", experiment, "--last", "3")
    assert _sides(data) == [
        ("old", [old]),
        ("naive", [job["naive"]]),
        ("rms_norm", [job["rms_norm"]]),
        ("new", [new]),
    ]
    data = _json(capsys, "--experiment", experiment, "--last", "2")
    assert data["baseline"] == job["naive"]
    assert [r["run_ids"] for r in data["runs"]] == [[job["naive"]], [job["rms_norm"]], [new]]
    # plain runs only: run by run, as before
    only = _experiment(client)
    a, b = _plain(client, only, 10.0, "a"), _plain(client, only, 15.0, "b")
    data = _json(capsys, "--experiment", only, "--last", "5")
    assert _sides(data) == [("a", [a]), ("b", [b])]


def test_a_parent_run_given_by_hand_stands_for_its_variants(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    old_parent, old = _job(client, experiment, {"naive": 10.0, "rms_norm": 8.0})
    new_parent, new = _job(client, experiment, {"naive": 12.0, "rms_norm": 9.0})
    # one parent: its variants, the first the baseline
    data = _json(capsys, new_parent)
    assert _sides(data) == [("naive", [new["naive"]]), ("rms_norm", [new["rms_norm"]])]
    # two parents: each variant pooled over both
    data = _json(capsys, old_parent, new_parent)
    assert _sides(data) == [
        ("naive", [old["naive"], new["naive"]]),
        ("rms_norm", [old["rms_norm"], new["rms_norm"]]),
    ]
    # --baseline PARENT alone: its first variant against its others
    data = _json(capsys, "--baseline", new_parent)
    assert _sides(data) == [("naive", [new["naive"]]), ("rms_norm", [new["rms_norm"]])]
    # the new job's variants against the old job's first variant
    data = _json(capsys, new_parent, "--baseline", old_parent)
    assert data["baseline"] == old["naive"]
    assert _sides(data) == [
        ("naive", [old["naive"]]),
        ("naive", [new["naive"]]),
        ("rms_norm", [new["rms_norm"]]),
    ]
    # a variant's own run id is a run like any other
    data = _json(capsys, new["rms_norm"], "--baseline", old["naive"])
    assert [r["run_ids"] for r in data["runs"]] == [[old["naive"]], [new["rms_norm"]]]


def test_split_by_keeps_variants_apart_and_reads_the_jobs_tags(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    jobs = []
    for commit, cpu in (("aaa", 10.0), ("aaa", 11.0), ("bbb", 14.0)):
        parent, children = _job(client, experiment, {"naive": cpu, "rms_norm": cpu - 2})
        client.set_tag(parent, "commit", commit)  # on the parent only
        jobs.append(children)
    data = _json(capsys, "--experiment", experiment, "--last", "3", "--split-by", "commit")
    assert _sides(data) == [
        ("commit=aaa naive", [jobs[0]["naive"], jobs[1]["naive"]]),
        ("commit=aaa rms_norm", [jobs[0]["rms_norm"], jobs[1]["rms_norm"]]),
        ("commit=bbb naive", [jobs[2]["naive"]]),
        ("commit=bbb rms_norm", [jobs[2]["rms_norm"]]),
    ]


def test_one_job_with_one_variant_is_not_enough(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    _, runs = _job(client, experiment, {"naive": 10.0})
    assert main(["compare", "--experiment", experiment, "--last", "1"]) == 2
    err = capsys.readouterr().err
    assert "give at least two runs or variants" in err and runs["naive"][:8] in err
    assert err.count("\n") == 1


def test_compare_prints_no_download_progress_bars(capsys) -> None:
    client = MlflowClient()
    experiment = _experiment(client)
    _, runs = _job(client, experiment, {"naive": 10.0, "rms_norm": 8.0})
    for run_id in runs.values():  # a window folder: compare downloads its files
        summary = {"summary": {"cpu_time_us": 10.0, "op_calls": 2.0, "ops": []}}
        client.log_text(run_id, json.dumps(summary), "profile/step_000000-000004/summary.json")
    assert main(["compare", "--experiment", experiment, "--last", "1"]) == 0
    err = capsys.readouterr().err
    assert "compared: naive (baseline)" in err  # the files were read ...
    assert "Downloading artifacts" not in err and "it/s" not in err, err  # ... quietly


@pytest.fixture(scope="module")
def recipe_job(tmp_path_factory) -> tuple[str, str, dict[str, str]]:
    """The RMSNorm main job, tiny, run once: (tracking URI, parent id, variant -> run id)."""
    root = tmp_path_factory.mktemp("recipe-job")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    args = ["--rows", "8", "--hidden", "32", "--active", "5", "--repeat", "1"]
    args += ["--variants", "naive,rms_norm", "--backend", "cpu", "--experiment", "main-job"]
    run_python([str(ROOT / "recipes" / "rmsnorm.py"), *args], uri, cwd=root)
    parent, children = parent_and_children(MlflowClient(uri), "main-job")
    return uri, parent, children


@pytest.mark.slow
def test_the_main_job_is_compared_variant_by_variant(recipe_job, monkeypatch, capsys) -> None:
    uri, parent, children = recipe_job
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    expected = [("naive", [children["naive"]]), ("rms_norm", [children["rms_norm"]])]
    by_experiment = _json(capsys, "--experiment", "main-job", "--last", "1")
    assert _sides(by_experiment) == expected
    assert _sides(_json(capsys, parent)) == expected
    assert main(["compare", parent, "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert f"compared: naive (baseline) = run {children['naive'][:8]}\n" in captured.err
    assert "Downloading artifacts" not in captured.err
