"""A spool that cleans up after itself: uploaded windows lose their trace files, nothing else.

Real windows from real profiled jobs, uploaded to the shared SQLite store (``done``), left
pending by an unreachable server, or half uploaded by an artifact store that refuses files.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.sinks.claims import claim, worker_running
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.sinks.spool_cleanup import cleanup_after_upload, prune, spool_bytes
from tests.conftest import free_port
from tests.helpers import inputs, rmsnorm_naive, run_python


def _job(spool: Path, windows: int = 1, **kwargs) -> nm.Profiler:
    """Profile ``windows`` windows of the naive RMSNorm into ``spool``; wait for the worker.
    The spool keeps its traces (``keep_local``) unless the caller says otherwise."""
    kwargs.setdefault("keep_local", True)
    profiled = nm.profile(
        backend="cpu",
        schedule=nm.Schedule(warmup=0, active=2, repeat=windows),
        local_dir=spool,
        **kwargs,
    )(rmsnorm_naive)
    x, w = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        for _ in range(2 * windows):
            profiled(x, w)
        profiled.profiler.session.wait()
        profiled.profiler.close()
    _released(spool)  # the job is over: its worker lets go of its windows
    return profiled.profiler


def _released(spool: Path, timeout_s: float = 30.0) -> None:
    """Wait until no window of ``spool`` is claimed (the worker releases right after upload)."""
    deadline = time.monotonic() + timeout_s
    for record in Spool(spool).windows():
        while (held := claim(record.path)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if held is not None:
            held.release()


OFFLINE_JOB = """
import sys
import neuron_mlflow as nm
from tests.helpers import inputs, rmsnorm_naive, run_python

profiled = nm.profile(backend="cpu", strict=False, schedule=nm.Schedule(warmup=0, active=2),
                      local_dir=sys.argv[1], keep_local=sys.argv[2] == "keep", upload_timeout_s=0)(
    rmsnorm_naive)
x, w = inputs()
for _ in range(2):
    profiled(x, w)
"""


def _offline_job(spool: Path, keep: bool = True) -> None:
    """One window profiled by a job (its own process, ended) that could not reach the tracking
    server: the window stays pending in ``spool``."""
    script = spool.parent / "offline_job.py"
    script.write_text(OFFLINE_JOB)
    unreachable = f"http://127.0.0.1:{free_port()}"
    run_python([str(script), str(spool), "keep" if keep else "clean"], unreachable)

    # its worker puts the window in place, gives it up (upload_timeout_s=0, its job ended;
    # the job stays queued for `sync`) and exits; until then `sync` leaves the window to it.
    # (An idle-class worker on a busy host may not hold its lock yet when the job ends.)
    def given_up() -> bool:
        pending = [r for r in Spool(spool).windows() if r.status == "pending"]
        return bool(pending) and not worker_running(spool)

    assert _eventually(given_up, timeout_s=120), "the worker places the window and exits"


def _traces(record: WindowRecord) -> list[Path]:
    folder = record.artifacts_dir / "traces"
    try:
        return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    except FileNotFoundError:  # being removed right now
        return _traces(record)


def _eventually(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def _by_status(spool: Path) -> dict[str, list[WindowRecord]]:
    out: dict[str, list[WindowRecord]] = {}
    for record in Spool(spool).windows():
        out.setdefault(record.status, []).append(record)
    return out


def test_after_a_job_the_spool_keeps_no_trace_of_an_uploaded_window(tmp_path) -> None:
    """The default: once MLflow has a window, its traces leave the spool (its record stays);
    keep_local=True keeps them; a window that could not be uploaded keeps everything."""
    _job(tmp_path / "default", windows=2, keep_local=False)
    done = list(Spool(tmp_path / "default").windows())
    assert [r.status for r in done] == ["done", "done"]
    assert _eventually(lambda: all(_traces(r) == [] for r in done))
    assert all((r.artifacts_dir / "summary.md").is_file() for r in done), "summaries stay"

    _job(tmp_path / "kept", keep_local=True)
    (kept,) = Spool(tmp_path / "kept").windows("done")
    assert _traces(kept)

    _offline_job(tmp_path / "offline", keep=False)
    (pending,) = Spool(tmp_path / "offline").windows()
    assert pending.status == "pending" and _traces(pending)


def test_prune_frees_uploaded_windows_and_nothing_else(tmp_path, capsys) -> None:
    spool = tmp_path / "spool"
    _job(spool, windows=2)
    _offline_job(spool)
    windows = _by_status(spool)
    assert len(windows["done"]) == 2 and len(windows["pending"]) == 1
    assert all(_traces(r) for r in windows["done"] + windows["pending"])
    (pending,) = windows["pending"]
    pending_files = {p: p.read_bytes() for p in pending.path.rglob("*") if p.is_file()}
    before = spool_bytes(spool)

    report = prune(spool)

    assert sorted(report.pruned) == sorted(str(r.path) for r in windows["done"])
    assert report.freed_bytes > 0 and spool_bytes(spool) <= before - report.freed_bytes
    assert report.kept == [(str(pending.path), "status pending: not uploaded")]
    for record in windows["done"]:
        assert _traces(record) == [], "an uploaded window's traces are gone"
        record.reload()
        assert record.status == "done", "its manifest stays: sync still knows it was uploaded"
        assert (record.artifacts_dir / "summary.md").is_file(), "its summaries stay"
    after = {p: p.read_bytes() for p in pending.path.rglob("*") if p.is_file()}
    assert after == pending_files, "a window that was not uploaded keeps every file"

    assert main(["sync", "--local-dir", str(spool)]) == 0
    assert "uploaded" in capsys.readouterr().out, "the pending window still uploads"
    assert prune(spool).pruned == [str(pending.path)]


def test_sync_prune_uploads_then_frees_every_uploaded_window(tmp_path, capsys) -> None:
    spool = tmp_path / "spool"
    _job(spool)
    _offline_job(spool)
    assert main(["sync", "--prune", "--local-dir", str(spool)]) == 0
    out = capsys.readouterr().out
    assert "uploaded" in out and "freed" in out and "2 uploaded windows" in out
    windows = _by_status(spool)
    assert list(windows) == ["done"] and len(windows["done"]) == 2
    assert all(_traces(r) == [] for r in windows["done"])
    assert main(["sync", "--prune", "--local-dir", str(spool)]) == 0
    assert "no trace files of uploaded windows" in capsys.readouterr().out


def test_cleanup_after_upload_removes_the_traces_unless_keep_local(tmp_path) -> None:
    spool = tmp_path / "spool"
    _job(spool, windows=2)
    first, second = Spool(spool).windows("done")
    traces = _traces(second)

    cleanup_after_upload(second.path, keep_local=True, local_max_bytes=None)
    assert _traces(second) == traces, "keep_local keeps every trace file"

    cleanup_after_upload(second.path, keep_local=False, local_max_bytes=None)
    assert _traces(second) == []
    assert (second.path / "manifest.json").is_file() and _traces(first), "only that window"


def test_the_size_cap_removes_the_oldest_uploaded_windows_first(tmp_path) -> None:
    spool = tmp_path / "spool"
    _job(spool, windows=3)
    oldest, middle, newest = Spool(spool).windows("done")
    cap = spool_bytes(spool) - 1  # one window's traces must go: the oldest

    cleanup_after_upload(newest.path, keep_local=True, local_max_bytes=cap)

    assert _traces(oldest) == [] and _traces(middle) and _traces(newest)
    assert spool_bytes(spool) <= cap


def _files(record: WindowRecord) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in record.path.rglob("*") if p.is_file()}


def test_a_failed_upload_keeps_everything(tmp_path) -> None:
    """The tracking server cannot be reached: the window stays pending, every file stays."""
    spool = tmp_path / "spool"
    _offline_job(spool)
    (record,) = Spool(spool).windows()
    assert record.status == "pending" and _traces(record)
    files = _files(record)

    cleanup_after_upload(record.path, keep_local=False, local_max_bytes=0)
    report = prune(spool)
    assert prune(spool, max_bytes=0).pruned == []

    assert report.pruned == [] and report.freed_bytes == 0
    assert _files(record) == files


def test_a_half_uploaded_window_keeps_everything(tmp_path) -> None:
    """The artifact store refuses files: metrics landed, artifacts did not, nothing goes."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the artifact store expects a folder")
    client = MlflowClient()
    experiment_id = client.create_experiment("refused", artifact_location=str(blocker / "art"))
    run = client.create_run(experiment_id)
    spool = tmp_path / "spool"
    _job(spool, strict=False, run_id=run.info.run_id)
    (record,) = Spool(spool).windows()
    assert record.status == "pending" and record.manifest["uploaded"]["metrics"] is True
    assert _traces(record)
    files = _files(record)

    cleanup_after_upload(record.path, keep_local=False, local_max_bytes=0)
    report = prune(spool)
    assert prune(spool, max_bytes=0).pruned == []

    assert report.pruned == [] and report.freed_bytes == 0
    assert _files(record) == files


def test_traces_that_were_never_uploaded_stay(tmp_path) -> None:
    """upload_traces=False: the spool holds the only copy of the traces."""
    spool = tmp_path / "spool"
    _job(spool, upload_traces=False)
    (record,) = Spool(spool).windows("done")
    traces = _traces(record)
    assert traces
    cleanup_after_upload(record.path, keep_local=False, local_max_bytes=0)
    report = prune(spool)
    assert _traces(record) == traces
    ((path, reason),) = report.kept
    assert path == str(record.path) and "never uploaded" in reason
