"""The worker process: it finishes what the training process queued, once, even after that
process is killed; one worker per spool; what it cannot take stays for ``sync``."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_mlflow.engine import worker
from neuron_mlflow.engine.sync import place_queued
from neuron_mlflow.engine.worker import CLIENTS, Worker, WorkerClient, read_job
from neuron_mlflow.sinks.claims import (
    QUEUE,
    WORKER_LOCK,
    claim,
    claim_file,
    release,
    worker_running,
)
from neuron_mlflow.sinks.spool import MANIFEST, Spool
from neuron_mlflow.sinks.window_record import Window, WindowState, decode_window, encode_window
from tests.helpers import ROOT, metric_history, run_python

CRASH_JOB = str(ROOT / "tests" / "engine" / "crash_job.py")
KILL_JOB = str(ROOT / "tests" / "engine" / "kill_job.py")


def _queued_spool(tmp_path: Path, tracking_uri: str, windows: int = 2) -> Path:
    """A spool whose job died (os._exit) with its windows queued and never summarised: each
    window's trace staged, its one record queued, not in place."""
    spool = tmp_path / "spool"
    run_python([CRASH_JOB, str(spool), str(windows)], tracking_uri)
    jobs = [read_job(spool, p) for p in (spool / QUEUE).glob("*.json")]
    assert len(jobs) == windows
    assert all(job.steps == 2 and job.config is not None for job in jobs), "complete"
    assert all(Spool(spool).staged_dir(job).is_dir() for job in jobs)
    assert list(Spool(spool).windows()) == [], "the worker puts them in place"
    return spool


def _wait(condition, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


def test_the_worker_finishes_a_dead_jobs_queue_once_and_exits(tmp_path, tracking_uri) -> None:
    spool = _queued_spool(tmp_path, tracking_uri)
    Worker(spool, idle_s=0.0).loop()  # returns: its only client is dead, the queue is done
    records = list(Spool(spool).windows())
    assert {r.status for r in records} == {"done"}
    assert all(r.manifest["handled"] and r.manifest["summarised"] for r in records)
    assert list((spool / QUEUE).glob("*.json")) == [], "the queue is empty"
    assert not worker_running(spool), "it let its lock go"
    assert list((spool / CLIENTS).glob("*.lock")) == [], "the dead job's registration is gone"
    (run_id,) = {r.manifest["run_id"] for r in records}
    steps = sorted(r.manifest["metric_step"] for r in records)
    assert [s for s, _ in metric_history(run_id, "profile/steps")] == steps, "each value once"
    Worker(spool, idle_s=0.0).loop()  # nothing queued: nothing sent again
    assert [s for s, _ in metric_history(run_id, "profile/steps")] == steps


def test_a_window_that_sync_holds_waits_for_it(tmp_path, tracking_uri) -> None:
    spool = _queued_spool(tmp_path, tracking_uri, windows=1)
    assert place_queued(spool).failed == []  # as `sync` does when no worker runs
    (record,) = list(Spool(spool).windows())
    assert record.window.steps == 2 and record.artifact_path == "profile/step_000001-000002"
    held = claim(record.path)  # a `neuron-mlflow sync` in another terminal
    assert held is not None
    try:
        assert Worker(spool).run_once() == 0, "the worker leaves it to sync"
    finally:
        held.release()
    record.reload()
    assert record.window.state.value == "spooled" and record.window.handled is False
    assert len(list((spool / QUEUE).glob("*.json"))) == 1, "the job stays for later"
    assert Worker(spool).run_once() == 1  # sync let go (without finishing): the worker does
    record.reload()
    assert record.status == "done" and record.window.handled


def test_an_unreadable_job_file_is_dropped(tmp_path, caplog) -> None:
    (tmp_path / QUEUE).mkdir()
    (tmp_path / QUEUE / "0001_bad.json").write_text("{not json")
    assert Worker(tmp_path).run_once() == 0
    assert list((tmp_path / QUEUE).iterdir()) == []
    assert "unreadable job" in caplog.text


def test_one_worker_per_spool(tmp_path) -> None:
    held = claim_file(tmp_path / WORKER_LOCK)  # a worker serves this spool
    assert held is not None
    try:
        client = WorkerClient(tmp_path)
        client.submit(Window(state=WindowState.SPOOLED, artifact_path="p/step_000000-000000",
                             session="nowhere", created="", captured_ms=0))  # fmt: skip
        assert client.ensure_running() is False, "no second worker"
        Worker(tmp_path).loop()  # returns at once: the lock is held
        assert len(client.queued()) == 1, "the running worker takes the job"
    finally:
        held.release()
        client.close()


def test_clients_of_one_process_start_one_worker_while_it_starts(tmp_path) -> None:
    # the callback's client and each stage's session's: the second must not start another
    # interpreter while the first is still importing (it would share the CPU with a window)
    first, second = WorkerClient(tmp_path), WorkerClient(tmp_path)
    try:
        assert first.ensure_running() is True
        assert second.ensure_running() is False
        process = worker._STARTED[tmp_path]
    finally:
        first.close()
        second.close()
    assert process.wait(timeout=60) == 0  # no client left: it exits
    assert worker_running(tmp_path) is False


def test_a_job_killed_right_after_its_window_is_still_uploaded(tmp_path, tracking_uri) -> None:
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=tracking_uri, PYTHONPATH=str(ROOT))
    job = subprocess.Popen(
        [sys.executable, KILL_JOB, str(spool)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ENDED"
    finally:
        job.send_signal(signal.SIGKILL)
        job.communicate(timeout=60)

    def handled() -> bool:  # the worker put the window in place, then uploaded it
        records = list(Spool(spool).windows())
        return bool(records) and all(r.manifest.get("handled") for r in records)

    _wait(handled)
    (record,) = list(Spool(spool).windows())
    assert record.status == "done", record.manifest.get("error")
    run_id = record.manifest["run_id"]
    assert metric_history(run_id, "profile/steps") == [(3, 3.0)], "once"
    _wait(lambda: not worker_running(spool))  # then it exits: its client is gone


def test_a_job_file_is_the_windows_record(tmp_path) -> None:
    window = Window(state=WindowState.SPOOLED, artifact_path="p/step_000001-000002",
                    session="s", created="", captured_ms=0, upload=False)  # fmt: skip
    busy = claim_file(tmp_path / WORKER_LOCK)  # no worker takes the job
    try:
        path = WorkerClient(tmp_path).submit(window)
        assert read_job(tmp_path, path) == window == decode_window(encode_window(window), "x")
        path.write_bytes(b'{"schema_version": 3, "state": 3}')
        with pytest.raises(ValueError, match="is not valid"):
            read_job(tmp_path, path)
    finally:
        release(busy)


def test_a_window_end_writes_only_its_job_and_the_worker_puts_the_window_in_place(
    tmp_path, tracking_uri
) -> None:
    # the end writes the window's one record into the queue; its trace is in the staging
    # folder; nothing else is written when the window opens
    import torch

    import neuron_mlflow as nm

    spool = tmp_path / "spool"
    spool.mkdir()
    busy = claim_file(spool / WORKER_LOCK)  # no worker runs until the test says so
    assert busy is not None
    prof = nm.profile(
        backend="cpu", schedule=nm.Schedule(wait=1, warmup=1, active=2), local_dir=str(spool),
        upload_timeout_s=0.0,
    )  # fmt: skip
    try:
        with prof:
            for step in range(4):
                torch.ones(4).mul_(2.0)
                prof.step()
                if step == 1:  # the window is open: warm-up done, recording
                    (staging,) = spool.glob("*/.capture/window_0")
                    assert [p.name for p in staging.iterdir()] == ["artifacts"]
                    assert list((spool / QUEUE).glob("*")) == [], "no job yet"
                    assert list(spool.glob("*/profile")) != [], "its place is made"
        (job_file,) = (spool / QUEUE).glob("*")
        job = read_job(spool, job_file)
        assert job.artifact_path == "profile/step_000002-000003" and job.steps == 2
        assert job.state is WindowState.SPOOLED and job.config is not None
        assert Spool(spool).staged_dir(job) == staging and staging.is_dir(), "not placed yet"
        assert [p.name for p in staging.iterdir()] == ["artifacts"], "no other file"
        assert list(Spool(spool).windows()) == []
        assert Worker(spool).run_once() == 1
    finally:
        busy.release()
    (record,) = list(Spool(spool).windows())
    assert record.artifact_path == "profile/step_000002-000003" and record.status == "done"
    assert record.window.steps == 2 and record.window.facts is not None
    assert record.window.tags["neuron_mlflow.host_load.cpu_count"] == str(os.cpu_count())
    assert not staging.exists(), "the staged window was renamed into place"
    assert not list(record.path.glob(".*.tmp"))


def test_a_window_that_cannot_be_placed_is_reported_and_nothing_is_deleted(
    tmp_path, tracking_uri
) -> None:
    spool = _queued_spool(tmp_path, tracking_uri, windows=1)
    (staging,) = spool.glob("*/.capture/window_0")
    (place,) = spool.glob("*/profile")
    place.rmdir()
    place.write_text("")  # a file where the window's folder goes: it cannot be placed
    placed = place_queued(spool)
    place.unlink()
    ((where, reason),) = placed.failed
    assert where.endswith("profile/step_000001-000002")
    assert "NotADirectoryError" in reason and "its capture stays at" in reason
    assert list(staging.rglob("*.pt.trace.json")), "nothing deleted"
    assert len(list((spool / QUEUE).glob("*.json"))) == 1, "the job stays, for the next try"
    assert place_queued(spool).failed == []  # the place can be made now
    (record,) = list(Spool(spool).windows())
    assert (record.path / MANIFEST).is_file() and not staging.exists()


def _policies(pid: int) -> set[int]:
    """The scheduling classes of every thread of process ``pid``."""
    return {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling classes: Linux")
def test_the_worker_runs_in_the_normal_class_only_while_a_client_waits(tmp_path) -> None:
    # the worker is idle-class (the training thread comes first); while the training process
    # waits for it, it leaves that class where the process may (root or RLIMIT_NICE 20), so
    # other processes keeping the host busy do not stall wait() (they did: 614 s for 9)
    client = WorkerClient(tmp_path)
    try:
        client.ensure_running()
        process = worker._STARTED[tmp_path]
        _wait(lambda: worker_running(tmp_path))  # it runs: the lock taken, its threads made
        assert _policies(process.pid) == {os.SCHED_IDLE}
        may = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
        with client.hurried():
            assert _policies(process.pid) == ({os.SCHED_OTHER} if may else {os.SCHED_IDLE})
        assert _policies(process.pid) == {os.SCHED_IDLE}
    finally:
        client.close()
    assert process.wait(timeout=60) == 0


def test_a_window_queued_after_its_worker_left_starts_one(tmp_path, tracking_uri) -> None:
    # The worker can leave while a window is captured: under load it may not see the
    # window's capturing lock (its own probe of that file held the flock when the window
    # claimed it), idle out and exit. The job queued at the window's end then has nobody to
    # take it unless queuing it makes sure a worker runs (seen in the full suite: a zombie
    # worker, an empty worker.log, the window left in .queue/ for good).
    import torch

    import neuron_mlflow as nm

    spool = (tmp_path / "spool").absolute()
    prof = nm.profile(backend="cpu", schedule=nm.Schedule(warmup=1, active=2), local_dir=str(spool))
    try:
        with prof:
            for step in range(4):
                torch.ones(4).mul_(2.0)
                if step == 1:  # the window is open: its worker leaves
                    process = worker._STARTED[spool]
                    process.kill()
                    process.wait(timeout=60)
                prof.step()
            # the window has ended and is queued; nobody waits for it (no wait(), no close())

            def handled() -> bool:
                records = list(Spool(spool).windows())
                return bool(records) and all(r.manifest.get("handled") for r in records)

            _wait(handled, timeout_s=120)
    finally:
        prof.close()
    (record,) = list(Spool(spool).windows())
    assert record.status == "done", record.manifest.get("error")
