"""Three messages a newcomer meets: `ingest` of a folder without traces names the folder,
`compare --experiment` with an unknown name lists the experiments there are, and `download`
of a job's parent run lists its child runs (where the windows are). Each is one line on
stderr with exit code 2, against a real MLflow SQLite store."""

from __future__ import annotations

import uuid

from mlflow import MlflowClient

from neuron_mlflow.cli import main
from neuron_mlflow.cli.app import EXIT_USAGE
from tests.helpers import ROOT

TRACE = ROOT / "tests" / "data" / "traces" / "cpu_only_rank34.json.gz"


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    return captured.err


def test_ingest_of_a_folder_without_traces_names_it(tmp_path, capsys) -> None:
    folder = tmp_path / "my-traces"
    folder.mkdir()
    (folder / "notes.json").write_text('{"not": "a trace"}')
    spool = tmp_path / "spool"
    err = _one_line_error(capsys, ["ingest", str(folder), "--local-dir", str(spool)])
    assert err.startswith(f"neuron-mlflow ingest: no trace files in {folder}: expected "), err
    assert "*.pt.trace.json[.gz]" in err and "Neuron profiles" in err
    assert not spool.exists()  # nothing spooled, no run made


def test_compare_of_an_unknown_experiment_lists_the_experiments(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    names = [f"exp-{number:02d}" for number in range(12)]
    for name in names:
        client.create_experiment(name)
    capsys.readouterr()  # the new store's "Creating tables" lines
    err = _one_line_error(capsys, ["compare", "--experiment", "nosuch", "--last", "2"])
    prefix = f"neuron-mlflow compare: experiment 'nosuch' was not found at {uri}; the experiments: "
    assert err.startswith(prefix), err
    listed = err[len(prefix) :].strip().split(", ")
    assert len(listed) == 11 and listed[-1] == "...", listed  # ten names, then "..."
    assert set(listed[:-1]) <= {*names, "Default"}


def test_download_of_a_parent_run_lists_its_child_runs(tmp_path, capsys) -> None:
    client = MlflowClient()
    experiment = client.create_experiment(f"job-{uuid.uuid4().hex[:8]}")
    parent = client.create_run(experiment, run_name="job").info.run_id
    children = {}
    for variant in ("naive", "rms_norm"):  # as the main job: one nested run per variant
        tags = {"mlflow.parentRunId": parent}
        child = client.create_run(experiment, run_name=variant, tags=tags).info.run_id
        ingest = ["ingest", str(TRACE), "--run-id", child, "--local-dir", str(tmp_path / "s")]
        assert main(ingest) == 0, capsys.readouterr().err
        children[variant] = child
    capsys.readouterr()
    err = _one_line_error(capsys, ["download", parent, "--dest", str(tmp_path / "d")])
    assert err.startswith(
        f"neuron-mlflow download: run '{parent}' has no profiling windows but has child runs"
    ), err
    assert f"{children['naive']} (naive), {children['rms_norm']} (rms_norm);" in err, err
    assert main(["download", children["naive"], "--dest", str(tmp_path / "d")]) == 0
