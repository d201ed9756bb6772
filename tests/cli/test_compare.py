"""`mlflow run . -e rmsnorm` end to end, then `neuron-mlflow compare` on its runs."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from tests.helpers import ROOT, parent_and_children, run_python

MLFLOW_RUN = ["-m", "mlflow", "run", str(ROOT), "--env-manager", "local"]


@pytest.fixture(scope="module")
def rmsnorm_runs(tmp_path_factory) -> tuple[str, dict[str, str], str]:
    """Run the rmsnorm entry point with `mlflow run`; return (uri, child run ids, parent id)."""
    root = tmp_path_factory.mktemp("mlflow-run")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    params = ["rows=8", "hidden=32", "warmup=1", "active=2", "backend=cpu"]
    out = run_python(
        [*MLFLOW_RUN, "-e", "rmsnorm", "--experiment-name", "rmsnorm-e2e"]
        + [arg for p in params for arg in ("-P", p)],
        uri,
        cwd=root,
    )
    assert "| naive |" in out  # the comparison is printed at the end
    parent, children = parent_and_children(MlflowClient(uri), "rmsnorm-e2e")
    return uri, children, parent


@pytest.mark.slow
def test_mlflow_run_rmsnorm_gives_three_children_and_a_comparison(rmsnorm_runs) -> None:
    uri, children, parent = rmsnorm_runs
    client = MlflowClient(uri)
    assert set(children) == {"naive", "rms_norm", "compiled"}
    calls = {
        name: client.get_run(i).data.metrics["profile/op_calls"] for name, i in children.items()
    }
    assert calls["naive"] == 6 and calls["rms_norm"] == 1 and calls["compiled"] <= 2
    assert "comparison.md" in [a.path for a in client.list_artifacts(parent)]
    parent_metrics = client.get_run(parent).data.metrics
    assert parent_metrics["comparison/rms_norm/op_calls"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_compare_every_format(rmsnorm_runs, monkeypatch, capsys, fmt) -> None:
    uri, children, _ = rmsnorm_runs
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ids = [children["naive"], children["rms_norm"], children["compiled"]]
    assert main(["compare", *ids, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        data = json.loads(out)
        assert data["baseline"] == children["naive"]
        assert data["time_metric"] == "cpu_time_us"
        change = data["headline_change_pct"][children["rms_norm"]]
        assert change["op_calls"] == pytest.approx(100 * (1 - 6) / 6)
        statuses = {row["op"]: row["status"] for row in data["ops"]}
        assert statuses["aten::add"][children["rms_norm"]] == "gone"  # fused uses add_
        assert statuses["aten::rms_norm"][children["rms_norm"]] == "new"
    else:
        assert "op_calls" in out and "cpu_time_us" in out
        assert "-83.3%" in out  # 6 -> 1 op calls
        assert "[gone]" in out and "[new]" in out
        if fmt == "markdown":
            assert "\n| metric |" in out


@pytest.mark.slow
def test_compare_by_experiment_counts_jobs(rmsnorm_runs, monkeypatch, capsys) -> None:
    uri, children, _ = rmsnorm_runs
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # the experiment holds one job (a parent and its three variants): --last 2 finds it alone
    assert main(["compare", "--experiment", "rmsnorm-e2e", "--last", "2", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    variants = ["naive", "rms_norm", "compiled"]  # in the order the recipe started them
    assert [r["name"] for r in data["runs"]] == variants
    assert [r["run_ids"] for r in data["runs"]] == [[children[v]] for v in variants]
    assert data["baseline"] == children["naive"]


@pytest.mark.slow
def test_regression_gate_passes_and_fails(rmsnorm_runs, monkeypatch, capsys) -> None:
    uri, children, _ = rmsnorm_runs
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    naive, fused = children["naive"], children["rms_norm"]
    # two steps a window, one window a run: the gate cannot decide either way
    assert main(["compare", fused, fused, "--fail-above", "0"]) == 3
    capsys.readouterr()
    # which one is slower is the estimator's call (the median step, not the summed total:
    # at 8x32 on a CPU the two are close and the sums can disagree with the medians)
    assert main(["compare", fused, "--baseline", naive, "--format", "json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimates"][fused]["cpu_time_us"]
    slower, faster = (fused, naive) if estimate["ratio"] >= 1 else (naive, fused)
    # the recipe's 3 windows of 20 steps: the exit code is what the reported interval says
    main(["compare", slower, "--baseline", faster, "--fail-above", "1", "--format", "json"])
    e = json.loads(capsys.readouterr().out)["estimates"][slower]["cpu_time_us"]
    assert e["ratio"] >= 1
    code = main(["compare", slower, "--baseline", faster, "--fail-above", "1"])
    err = capsys.readouterr().err
    if e["low"] is not None and e["low"] > 1.01:
        assert code == 1 and "the whole interval is above 1.01" in err, err[-600:]
    elif e["low"] is None or e["high"] > 1.01:
        assert code == 3, err[-600:]
        assert "exit 3" in err and ("too few samples" in err or "too wide" in err), err[-600:]
    else:
        assert code == 0, err[-600:]  # decided: at most 1 % slower
    args = ["--fail-above", "1", "--allow-insufficient"]  # turns exit 3 into 0, nothing else
    assert main(["compare", slower, "--baseline", faster, *args]) == (0 if code == 3 else code)


def test_bad_run_ids_and_runs_without_profile_metrics_exit_2(capsys, tracking_uri) -> None:
    client = MlflowClient()
    plain = client.create_run("0").info.run_id
    profiled = client.create_run("0").info.run_id
    client.log_metric(profiled, "profile/op_calls", 3.0)
    client.log_metric(profiled, "profile/cpu_time_us", 10.0)
    assert main(["compare", profiled, "0123456789abcdef0123456789abcdef"]) == 2
    assert "run '0123456789abcdef0123456789abcdef' was not found" in capsys.readouterr().err
    assert main(["compare", profiled, plain]) == 2
    assert f"run '{plain}' has no profile metrics" in capsys.readouterr().err
    assert main(["compare", profiled]) == 2
    assert "at least two runs" in capsys.readouterr().err
    assert main(["compare", profiled, profiled, "--prefix", "nope"]) == 2
    assert "has no metrics under prefix 'nope'" in capsys.readouterr().err
    assert main(["compare", "--experiment", "x"]) == 2
    assert main(["compare", profiled, profiled, "--format", "yaml"]) == 2


def test_compare_reads_metrics_when_there_is_no_summary_artifact(capsys) -> None:
    client = MlflowClient()
    a, b = (client.create_run("0").info.run_id for _ in range(2))
    for run, cpu in ((a, 10.0), (b, 15.0)):
        client.log_metric(run, "profile/op_calls", 2.0)
        client.log_metric(run, "profile/cpu_time_us", cpu)
        client.log_metric(run, "profile/op/aten.mul/self_cpu_us", cpu)
    # an old run: one window, one value a metric: it still compares, and says it cannot decide
    assert main(["compare", a, b, "--format", "json", "--fail-above", "40"]) == 3
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["headline_change_pct"][b]["cpu_time_us"] == pytest.approx(50.0)
    estimate = data["estimates"][b]["cpu_time_us"]
    assert estimate["verdict"] == "insufficient data" and estimate["ratio"] == pytest.approx(1.5)
    assert "insufficient data for --fail-above 40 (exit 3)" in captured.err
    (row,) = data["ops"]
    assert row["op"] == "aten.mul" and row["delta_pct"][b] == pytest.approx(50.0)
    assert row["estimate"][b]["verdict"] == "insufficient data"
    assert main(["compare", a, b, "--fail-above", "40", "--allow-insufficient"]) == 0
    # three windows a side (the metric history) are enough to decide
    for run, cpu in ((a, 10.0), (b, 15.0)):
        for step, wobble in ((5, 0.1), (9, -0.1)):
            client.log_metric(run, "profile/cpu_time_us", cpu + wobble, step=step)
    assert main(["compare", a, b, "--format", "json", "--fail-above", "40"]) == 1
    assert "regression: run " in capsys.readouterr().err
    # a limit inside the interval (about [1.48, 1.52]): exit 3, and the message says why
    assert main(["compare", a, b, "--fail-above", "50"]) == 3
    err = capsys.readouterr().err
    assert "cpu_time_us: insufficient data (too wide to decide: the interval " in err
    assert "reaches above 1.50" in err


def test_runs_with_different_prefixes_are_compared_on_what_they_share(capsys) -> None:
    client = MlflowClient()
    a, b = (client.create_run("0").info.run_id for _ in range(2))
    client.log_metric(a, "profile/train/op_calls", 2.0)
    client.log_metric(a, "profile/train/cpu_time_us", 4.0)
    client.log_metric(a, "profile/train/device_time_us", 3.0)
    client.log_metric(b, "profile/train/op_calls", 2.0)
    client.log_metric(b, "profile/train/cpu_time_us", 5.0)
    client.log_metric(b, "profile/validate/op_calls", 1.0)
    client.log_metric(b, "profile/validate/cpu_time_us", 1.0)
    assert main(["compare", a, b, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "left out: device_time_us" in out
    assert "Headline time metric: cpu_time_us" in out


@pytest.mark.slow
def test_compare_entry_point_through_mlflow_run(rmsnorm_runs, tmp_path) -> None:
    uri, _, _ = rmsnorm_runs
    out = run_python(
        [
            *MLFLOW_RUN,
            "-e",
            "compare",
            "--experiment-name",
            "compare-runs",
            "-P",
            "experiment=rmsnorm-e2e",
            "-P",
            "last=3",
        ],
        uri,
        cwd=tmp_path,
    )
    assert "\n| metric |" in out  # a Markdown table, after the result line
    assert "Headline time metric: cpu_time_us" in out
