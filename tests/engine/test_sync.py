"""`sync` after a crash between spooling a window and summarising it: the window is
summarised from its own trace by the same engine (the metrics equal ``summarize`` of the
uploaded trace), its summary files are written, and it is uploaded once."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from neuron_mlflow.engine.sync import place_queued
from neuron_mlflow.naming import window_metrics
from neuron_mlflow.sinks.spool import Spool
from neuron_mlflow.trace.summarize import summarize_trace
from tests.helpers import ROOT, artifact_files, metric_history, run_python

JOB = str(ROOT / "tests" / "engine" / "crash_job.py")


def _crash(
    tmp_path: Path,
    tracking_uri: str,
    windows: int,
    backend: str = "cpu",
    place: bool = True,
    **env: str,
) -> Path:
    """The job died before its worker put its windows in place (``place``: ``sync``'s
    first step puts them in place now, as it would)."""
    spool = tmp_path / "spool"
    run_python([JOB, str(spool), str(windows), backend], tracking_uri, **env)
    assert list(Spool(spool).windows()) == [], "staged, their end facts queued"
    if not place:
        return spool
    placed = place_queued(spool)
    assert placed.failed == [] and placed.busy == []
    records = list(Spool(spool).windows())
    assert len(records) == windows
    assert all(r.manifest["summarised"] is False and not r.manifest["metrics"] for r in records)
    assert all(r.status == "pending" for r in records)
    return spool


def test_sync_summarises_a_window_the_crashed_process_never_summarised(
    tmp_path, tracking_uri, capsys
) -> None:
    spool = _crash(tmp_path, tracking_uri, windows=2, place=False)
    assert main(["sync", "--local-dir", str(spool)]) == 0  # puts them in place, then uploads
    records = list(Spool(spool).windows())
    assert len(records) == 2 and {r.status for r in records} == {"done"}
    assert all(r.manifest["summarised"] is True for r in records)
    (run_id,) = {r.manifest["run_id"] for r in records}

    client = MlflowClient()
    files = artifact_files(run_id)
    for record in records:
        folder = record.manifest["artifact_path"]
        for name in ("summary.md", "ops.csv", "summary.json", "report.html", "config.json"):
            assert f"{folder}/{name}" in files, (name, files)
        (trace,) = [f for f in files if f.startswith(f"{folder}/traces/rank_0/")]
        assert trace.endswith(".json.gz"), trace  # compressed after the summary, as live
        local = Path(client.download_artifacts(run_id, trace, str(tmp_path / folder)))
        gzip.decompress(local.read_bytes())
        offline = window_metrics(summarize_trace(local).summary, "profile", 1000)
        assert offline["profile/steps"] == 2.0
        assert offline["profile/op_calls"] > 0
        last = record.manifest["window"]["last"]
        for key, value in offline.items():
            history = metric_history(run_id, key)
            at_window = [v for step, v in history if step == last]
            assert len(at_window) == 1, (key, history)  # exactly once
            if key.endswith(("/calls", "op_calls", "/steps")):
                assert at_window[0] == value, key
            else:
                assert at_window[0] == pytest.approx(value, rel=1e-6, abs=1e-6), key

    # a second sync has nothing left to do
    capsys.readouterr()
    assert main(["sync", "--local-dir", str(spool)]) == 0
    assert "nothing to upload" in capsys.readouterr().out


def test_a_window_whose_trace_cannot_be_summarised_stays_pending_and_the_rest_upload(
    tmp_path, tracking_uri, capsys
) -> None:
    spool = _crash(tmp_path, tracking_uri, windows=2)
    broken, good = list(Spool(spool).windows())
    (trace,) = [p for p in broken.artifacts_dir.rglob("*.json") if "traces" in p.parts]
    trace.write_text(trace.read_text()[:200])  # cut short, as a full disk leaves it

    assert main(["sync", "--local-dir", str(spool)]) == 1
    err = capsys.readouterr().err
    assert f"failed {broken.path}" in err
    assert "summarising the window from its trace failed" in err
    assert str(broken.artifacts_dir) in err
    by_path = {str(r.path): r for r in Spool(spool).windows()}
    assert by_path[str(broken.path)].status == "pending"  # kept, traces and all
    assert trace.exists()
    assert by_path[str(good.path)].status == "done"
    run_id = by_path[str(good.path)].manifest["run_id"]
    files = artifact_files(run_id)
    assert not any(f.startswith(broken.manifest["artifact_path"]) for f in files)
    assert metric_history(run_id, "profile/steps") == [(good.manifest["window"]["last"], 2.0)]


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same host", "other host"])
def test_sync_summarises_a_neuron_window_where_no_neuron_sdk_is_installed(
    tmp_path, tracking_uri, elsewhere
) -> None:
    """The job ran on a (double of a) Trainium host; sync runs here, without torch_neuronx:
    the device time comes from the window's own trace, as the worker would have read it."""
    double = ROOT / "tests" / "neuron_double"
    env = {"PYTHONPATH": f"{double}{os.pathsep}{ROOT}", "NEURON_DOUBLE_DEVICE_TIME": "trace"}
    spool = _crash(tmp_path, tracking_uri, 1, "neuron", **env)
    (record,) = list(Spool(spool).windows())
    if elsewhere:  # the job ran on another host than this sync
        record.window.tags["neuron_mlflow.host"] = "trn2-host-17"
        record.save()
    assert main(["sync", "--local-dir", str(spool)]) == 0
    (record,) = list(Spool(spool).windows())
    run = MlflowClient().get_run(record.manifest["run_id"])
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["neuron_mlflow.device_time_source"] == "trace"
    per_op = {k: v for k, v in metrics.items() if k.endswith("/self_device_us")}
    assert metrics["profile/op/aten.mul/self_device_us"] > 0
    assert metrics["profile/device_time_us"] == pytest.approx(sum(per_op.values()))
    assert 0 < metrics["profile/device_busy_pct"] <= 100
    document = json.loads((record.artifacts_dir / "summary.json").read_text())
    skipped = [e for e in document["errors"] if "device analysis" in e]
    if elsewhere:  # the chip's peak and core count would be this host's: not guessed
        assert "profile/mfu_pct" not in metrics
        assert len(skipped) == 1 and "trn2-host-17" in skipped[0], document["errors"]
    else:
        assert skipped == []


def test_sync_leaves_a_running_jobs_windows_to_it_and_takes_them_once_it_is_killed(
    tmp_path, tracking_uri, capsys
) -> None:
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=tracking_uri, PYTHONPATH=str(ROOT), CRASH_JOB_HOLD="1")
    job = subprocess.Popen(
        [sys.executable, JOB, str(spool), "2"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "SPOOLED"
        assert len(list((spool / ".queue").glob("*.json"))) == 2
        assert main(["sync", "--local-dir", str(spool)]) == 0  # the job still owns them
        out, err = capsys.readouterr()
        assert "a worker process is uploading every pending window" in out
        assert err.count("skipped (a worker process is still uploading it)") == 2
        assert list(Spool(spool).windows()) == [], "left staged, for its worker"
    finally:
        job.send_signal(signal.SIGKILL)  # a crash: the OS drops the job's claims
        job.communicate(timeout=60)
    assert main(["sync", "--local-dir", str(spool)]) == 0
    records = list(Spool(spool).windows())
    assert {r.status for r in records} == {"done"}
    (run_id,) = {r.manifest["run_id"] for r in records}
    steps = sorted(r.manifest["window"]["last"] for r in records)
    assert metric_history(run_id, "profile/steps") == [(step, 2.0) for step in steps]
