"""Offline-first: an unreachable tracking server, then `neuron-mlflow sync`; and real HTTP."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.sinks.claims import QUEUE, WORKER_LOCK, claim_file, queued_for_worker
from neuron_mlflow.sinks.pending import upload_pending
from neuron_mlflow.sinks.spool import Spool
from neuron_mlflow.sinks.window_record import SCHEMA_VERSION, Window, WindowState, encode_window
from tests.conftest import free_port
from tests.helpers import artifact_files, inputs, metric_history, metrics, rmsnorm_naive

WINDOW = "profile/step_000001-000002"


def _profile_offline(monkeypatch, tmp_path, **kwargs):
    """Profile one window while the tracking server is unreachable (non-strict)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    profiled = nm.profile(
        backend="cpu",
        strict=False,
        schedule=nm.Schedule(warmup=1, active=2),
        local_dir=tmp_path / "spool",
        **kwargs,
    )(rmsnorm_naive)
    x, w = inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [profiled(x, w) for _ in range(4)]
        profiled.profiler.session.wait()  # the background worker has tried the upload
    assert torch.equal(results[-1], rmsnorm_naive(x, w)), "the user's function kept running"
    return profiled, [
        str(w.message) for w in caught if issubclass(w.category, nm.NeuronMlflowWarning)
    ]


def test_unreachable_server_keeps_the_window_pending_then_sync_uploads_it_once(
    monkeypatch, tmp_path, tracking_uri, capsys
) -> None:
    profiled, messages = _profile_offline(monkeypatch, tmp_path, experiment_name="offline")
    (record,) = list(Spool(tmp_path / "spool").windows())
    assert record.status == "pending"
    assert len(messages) == 1
    assert str(record.path) in messages[0] and "neuron-mlflow sync" in messages[0]
    assert "cannot connect" in messages[0]
    assert profiled.profiler.run_id is None

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    out = capsys.readouterr().out
    (record,) = list(Spool(tmp_path / "spool").windows())
    assert record.status == "done"
    run_id = record.manifest["run_id"]
    assert f"-> run {run_id}" in out
    run = MlflowClient().get_run(run_id)
    assert MlflowClient().get_experiment(run.info.experiment_id).name == "offline"
    assert metrics(run_id)["profile/op_calls"] == 6
    assert f"{WINDOW}/summary.json" in artifact_files(run_id)
    assert run.data.tags["neuron_mlflow.backend"] == "cpu"

    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    assert "nothing to upload" in capsys.readouterr().out
    assert metric_history(run_id, "profile/op_calls") == [(2, 6.0)], "uploaded once only"


def test_sync_goes_into_the_original_run_when_it_exists(monkeypatch, tmp_path, tracking_uri):
    run = MlflowClient(tracking_uri).create_run("0")
    _profile_offline(monkeypatch, tmp_path, run_id=run.info.run_id)
    (record,) = list(Spool(tmp_path / "spool").windows("pending"))
    assert record.manifest["run_id"] == run.info.run_id

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    assert metrics(run.info.run_id)["profile/steps"] == 2


def test_upload_failing_halfway_is_resumed_without_duplicates(monkeypatch, tmp_path) -> None:
    client = MlflowClient()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the artifact store expects a folder")
    experiment_id = client.create_experiment("halfway", artifact_location=str(blocker / "art"))
    run = client.create_run(experiment_id)
    profiled = nm.profile(
        backend="cpu",
        strict=False,
        run_id=run.info.run_id,
        schedule=nm.Schedule(warmup=1, active=2),
        local_dir=tmp_path / "spool",
    )(rmsnorm_naive)
    with pytest.warns(nm.NeuronMlflowWarning, match="pending"):
        for _ in range(3):
            profiled(*inputs())
        profiled.profiler.session.wait()  # the background worker has tried the upload
    (record,) = list(Spool(tmp_path / "spool").windows("pending"))
    assert record.manifest["uploaded"] == {
        "tags": True,
        "params": True,
        "metrics": True,
        "artifacts": False,
    }
    blocker.unlink()  # the artifact store becomes writable
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    assert metric_history(run.info.run_id, "profile/op_calls") == [(2, 6.0)]
    assert f"{WINDOW}/ops.csv" in artifact_files(run.info.run_id)


def test_incomplete_windows_are_skipped_unless_asked(monkeypatch, tmp_path, capsys) -> None:
    @nm.profile(
        backend="cpu", strict=False, schedule=nm.Schedule(warmup=0, active=3), local_dir="spool"
    )
    def step(i: int) -> torch.Tensor:
        if i == 1:
            raise ValueError("bad batch")
        return torch.ones(2) * i

    step(0)
    with pytest.warns(nm.NeuronMlflowWarning), pytest.raises(ValueError):
        step(1)
    assert main(["sync", "--local-dir", "spool"]) == 0
    captured = capsys.readouterr()
    assert "skipped (incomplete)" in captured.err and "nothing to upload" in captured.out
    assert main(["sync", "--local-dir", "spool", "--include-incomplete"]) == 0
    (record,) = list(Spool("spool").windows())
    assert record.status == "done"
    assert metrics(record.manifest["run_id"])["profile/steps"] == 2


def test_sync_to_an_unreachable_server_fails_clearly(monkeypatch, tmp_path, capsys) -> None:
    _profile_offline(monkeypatch, tmp_path)
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to the MLflow tracking server" in err
    assert "nothing was uploaded" in err


def test_real_mlflow_server_over_http(monkeypatch, tmp_path, mlflow_server) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    profiled = nm.profile(
        backend="cpu", experiment_name="over-http", schedule=nm.Schedule(warmup=0, active=2)
    )(rmsnorm_naive)
    for _ in range(2):
        profiled(*inputs())
    run_id = profiled.profiler.run_id
    assert MlflowClient(mlflow_server).get_run(run_id).data.metrics["profile/op_calls"] == 6
    files = artifact_files(run_id)
    assert any(f.startswith("profile/step_000000-000001/traces/rank_0/") for f in files)


def test_spool_written_offline_syncs_to_a_real_server(monkeypatch, tmp_path, mlflow_server):
    _profile_offline(monkeypatch, tmp_path, experiment_name="later-over-http")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    (record,) = list(Spool(tmp_path / "spool").windows())
    manifest = json.loads((record.path / "manifest.json").read_text())  # the record on disk
    assert manifest["state"] == "uploaded" and manifest["schema_version"] == SCHEMA_VERSION
    assert metrics(manifest["run_id"])["profile/steps"] == 2
    shutil.rmtree(tmp_path / "spool")


def test_sync_leaves_a_window_queued_for_a_running_worker_to_it(tmp_path) -> None:
    # the worker put its queued window in place (its job, the window's record, still queued)
    # and has not finished it yet: `sync` must not take it from the worker
    spool = Spool(tmp_path / "spool")
    record = spool.create_window(spool.new_session_dir(), WINDOW)
    job = Window(state=WindowState.SPOOLED, artifact_path=WINDOW, session=record.window.session,
                 created="", captured_ms=0)  # fmt: skip
    (spool.root / QUEUE).mkdir()
    (spool.root / QUEUE / "00000000000000000001_1_0.json").write_bytes(encode_window(job))
    worker = claim_file(spool.root / WORKER_LOCK)  # a worker serves this spool
    assert worker is not None
    try:
        assert queued_for_worker(spool.root) == {record.path.absolute()}
        report = upload_pending(str(spool.root))
        assert report.busy == [str(record.path)] and report.uploaded == []
    finally:
        worker.release()
    assert queued_for_worker(spool.root) == set(), "no worker runs: sync takes it"
    assert [path for path, _ in upload_pending(str(spool.root)).uploaded] == [str(record.path)]
