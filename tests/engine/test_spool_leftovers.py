"""What the spool keeps once jobs have ended: the windows (their records, summaries and, until
uploaded, traces), nothing else. No lock file of a window's capture or of a process that is
gone, no empty staging folder, no job file of a window that was finished, no copy of an
ingested trace once it is uploaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.engine.worker import CAPTURING, CLIENTS, Worker
from neuron_mlflow.sinks.claims import QUEUE, worker_running
from neuron_mlflow.sinks.spool import CAPTURE, Spool
from tests.helpers import ROOT, artifact_files, inputs, metric_history, rmsnorm_naive, run_python

CRASH_JOB = str(ROOT / "tests" / "engine" / "crash_job.py")

MID_WINDOW_JOB = """
import sys, time
import neuron_mlflow as nm
from tests.helpers import inputs, rmsnorm_naive

profiled = nm.profile(backend="cpu", local_dir=sys.argv[1],
                      schedule=nm.Schedule(warmup=1, active=3))(rmsnorm_naive)
x, w = inputs()
for _ in range(3):  # the window's warm-up step and two of its three recorded steps
    profiled(x, w)
print("OPEN", flush=True)
time.sleep(600)
"""


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*")) if folder.is_dir() else []


def _wait(condition, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


def test_sessions_leave_no_capturing_lock_nor_staging_folder(tmp_path, tracking_uri) -> None:
    spool = tmp_path / "spool"
    x, w = inputs()
    run_ids = []
    for _ in range(3):  # three profiling sessions, one window each, one after the other
        prof = nm.Profiler(
            backend="cpu", local_dir=str(spool), schedule=nm.Schedule(warmup=1, active=2)
        )
        profiled = prof(rmsnorm_naive)
        for _ in range(3):
            profiled(x, w)
        assert prof.wait(120)
        run_ids.append(prof.run_id)
        prof.close()
    assert _files(spool / CAPTURING) == [], "one lock file was left per session"
    records = list(Spool(spool).windows())
    assert len(records) == 3 and {r.status for r in records} == {"done"}
    assert [p for p in spool.glob(f"*/{CAPTURE}")] == [], "an empty staging folder per session"
    for run_id in set(run_ids):
        assert metric_history(run_id, "profile/steps") == [(2, 2.0)] * run_ids.count(run_id)


def _start(args: list[str], spool: Path, tracking_uri: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=tracking_uri, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, *args, str(spool)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_a_job_killed_inside_a_window_leaves_nothing_after_sync(
    tmp_path, tracking_uri, capsys
) -> None:
    spool = tmp_path / "spool"
    job = _start(["-c", MID_WINDOW_JOB], spool, tracking_uri)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "OPEN"
        (lock,) = _files(spool / CAPTURING)  # held while the window is captured
        assert Worker(spool).capture_in_progress() and lock.exists(), "a living capture stays"
    finally:
        job.send_signal(signal.SIGKILL)  # in the middle of the window
        job.communicate(timeout=60)
    _wait(lambda: not worker_running(spool))  # its worker leaves: nothing queued
    staged = list(spool.glob(f"*/{CAPTURE}/window_0"))
    assert len(staged) == 1 and not [p for p in staged[0].rglob("*") if p.is_file()]
    assert Worker(spool).capture_in_progress() is False
    assert _files(spool / CAPTURING) == [], "the dead process's capturing lock is removed"
    assert main(["sync", "--local-dir", str(spool)]) == 0
    assert "nothing to upload" in capsys.readouterr().out
    assert _files(spool / CLIENTS) == []
    sessions = [p for p in _files(spool) if p.is_dir() and not p.name.startswith(".")]
    assert sessions == [], "the session's empty tree is gone"


def test_sync_after_a_crash_leaves_no_job_nor_client_lock(tmp_path, tracking_uri) -> None:
    spool = tmp_path / "spool"
    run_python([CRASH_JOB, str(spool), "2"], tracking_uri)  # no worker ran; os._exit
    assert len(_files(spool / QUEUE)) == 2 and len(_files(spool / CLIENTS)) == 1
    assert main(["sync", "--local-dir", str(spool)]) == 0
    records = list(Spool(spool).windows())
    assert len(records) == 2 and {r.status for r in records} == {"done"}
    assert _files(spool / QUEUE) == [], "sync finished their windows: their jobs are done"
    assert _files(spool / CLIENTS) == [], "the dead job's registration is gone"
    assert _files(spool / CAPTURING) == []
    assert [p for p in spool.glob(f"*/{CAPTURE}")] == []
    (run_id,) = {r.manifest["run_id"] for r in records}
    steps = sorted(r.manifest["metric_step"] for r in records)
    assert [s for s, _ in metric_history(run_id, "profile/steps")] == steps
    Worker(spool, idle_s=0.0).loop()  # a later worker, and a later sync: nothing sent again
    assert main(["sync", "--local-dir", str(spool)]) == 0
    assert [s for s, _ in metric_history(run_id, "profile/steps")] == steps


def test_ingest_removes_the_spools_copy_of_the_trace_once_uploaded(tmp_path, tracking_uri):
    trace = tmp_path / "trace.json"
    x, w = inputs()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        rmsnorm_naive(x, w)
    prof.export_chrome_trace(str(trace))
    original = trace.read_bytes()
    spool = tmp_path / "ing1"
    assert main(["ingest", str(trace), "--local-dir", str(spool), "--experiment", "e"]) == 0
    (record,) = list(Spool(spool).windows())
    assert record.status == "done"
    uploaded = artifact_files(record.manifest["run_id"])
    assert [p for p in uploaded if p.endswith("traces/rank_0/trace.json")] != [], uploaded
    assert metric_history(record.manifest["run_id"], "profile/steps") == [(0, 1.0)]
    assert [p for p in spool.rglob("trace.json")] == [], "the spool's copy is removed"
    assert (record.artifacts_dir / "summary.md").is_file(), "the summary stays"
    assert trace.read_bytes() == original, "the user's own file is never touched"
    assert [p for p in spool.glob(f"*/{CAPTURE}")] == []
