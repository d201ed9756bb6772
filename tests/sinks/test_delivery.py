"""Exactly-once delivery: chunks and files marked when confirmed; config changes; runs per job."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric

from neuron_mlflow.naming import CONFIG_CHANGED_TAG, JOB_TAG
from neuron_mlflow.sinks.delivery import metric_chunks
from neuron_mlflow.sinks.mlflow_sink import MlflowSink
from neuron_mlflow.sinks.pending import upload_pending
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.sinks.window_record import UploadProgress, WindowState
from tests.helpers import artifact_files


def spooled_window(
    spool: Spool,
    session: Path,
    first: int,
    n_metrics: int = 10,
    config: dict | None = None,
    prefix: str = "profile",
    **fields,
) -> WindowRecord:
    """A window as the engine spools it: metrics, params from ``config``, a few files."""
    path = f"{prefix}/step_{first:06d}-{first + 1:06d}"
    config = config or {"schedule.active": "2"}
    record = spool.create_window(
        session,
        path,
        metrics={f"{prefix}/op/op{i:05d}/cpu_time_us": float(i + first) for i in range(n_metrics)},
        params={f"{prefix}/config/{k}": v for k, v in config.items()},
        tags={"neuron_mlflow.backend": "cpu"},
        metric_step=first + 1,
        prefix=prefix,
        **fields,
    )
    (record.artifacts_dir / "summary.md").write_text("# summary\n")
    (record.artifacts_dir / "config.json").write_text(json.dumps(config))
    trace = record.artifacts_dir / "traces" / "rank_0"
    trace.mkdir(parents=True)
    (trace / "trace.json").write_text("{}")
    return record


def history(run_id: str, key: str) -> list[tuple[int, int, float]]:
    return [(m.step, m.timestamp, m.value) for m in MlflowClient().get_metric_history(run_id, key)]


def test_metrics_keep_the_capture_time_and_chunks_are_marked(tmp_path) -> None:
    spool = Spool(tmp_path / "spool")
    record = spooled_window(spool, spool.new_session_dir(), 0, n_metrics=2500)
    record.update(captured_ms=1_600_000_000_000)
    sink = MlflowSink()
    run_id = sink.create_run()
    sink.upload(record, run_id)
    assert history(run_id, "profile/op/op02499/cpu_time_us") == [(1, 1_600_000_000_000, 2499.0)]
    assert record.manifest["progress"]["metric_chunks"] == [0, 1, 2]
    assert sorted(record.manifest["progress"]["artifact_files"]) == [
        "config.json",
        "summary.md",
        "traces/rank_0/trace.json",
    ]
    assert "profile/step_000000-000001/traces/rank_0/trace.json" in artifact_files(run_id)


def test_a_chunk_in_flight_at_a_crash_is_looked_up_before_it_is_sent_again(tmp_path) -> None:
    spool = Spool(tmp_path / "spool")
    session = spool.new_session_dir()
    landed = spooled_window(spool, session, 0, n_metrics=1500)
    lost = spooled_window(spool, session, 10, n_metrics=1500)
    sink = MlflowSink()
    run_id = sink.create_run()
    sink.upload(landed, run_id)
    # A crash right after the server stored chunk 1 of `landed` (not yet marked) ...
    landed.window.progress.metric_chunks, landed.window.progress.sending = [0], 1
    landed.window.uploaded.metrics = False
    landed.update(state=WindowState.SUMMARISED)
    # ... and one right before the server stored chunk 1 of `lost`.
    lost.update(run_id=run_id, progress=UploadProgress(metric_chunks=[0], sending=1))
    sink.client.log_batch(
        run_id,
        metrics=[
            Metric(k, v, lost.manifest["captured_ms"], 11)
            for k, v in metric_chunks(lost.manifest["metrics"])[0]
        ],
    )
    report = upload_pending(str(tmp_path / "spool"))
    assert not report.failed
    for key in ("profile/op/op00000/cpu_time_us", "profile/op/op01499/cpu_time_us"):
        steps = [step for step, _, _ in history(run_id, key)]
        assert steps == [1, 11], f"{key}: each window's value exactly once"


def test_params_once_per_prefix_and_a_changed_config_is_tagged(tmp_path) -> None:
    spool = Spool(tmp_path / "spool")
    session = spool.new_session_dir()
    first = spooled_window(spool, session, 0, config={"schedule.active": "2", "top_k": "20"})
    same = spooled_window(spool, session, 10, config={"schedule.active": "2", "top_k": "20"})
    changed = spooled_window(spool, session, 20, config={"schedule.active": "2", "top_k": "5"})
    later = spooled_window(spool, session, 30, config={"schedule.active": "3", "top_k": "5"})
    other = spooled_window(spool, session, 0, config={"top_k": "7"}, prefix="eval")
    sink = MlflowSink()
    run_id = sink.create_run()
    for record in (first, same, changed, later, other):
        sink.upload(record, run_id)
    run = MlflowClient().get_run(run_id)
    assert run.data.params["profile/config/top_k"] == "20", "params are never changed"
    assert run.data.params["eval/config/top_k"] == "7", "each prefix has its own params"
    assert run.data.tags[f"{CONFIG_CHANGED_TAG}/profile"] == "profile/step_000020-000021"
    assert f"{CONFIG_CHANGED_TAG}/eval" not in run.data.tags
    assert history(run_id, "profile/op/op00000/cpu_time_us")[-1][0] == 31, "metrics uploaded"
    files = artifact_files(run_id)
    assert "profile/step_000030-000031/config.json" in files
    assert all(r.status == "done" for r in (first, same, changed, later, other))


def test_offline_ranks_of_one_job_sync_into_one_run(tmp_path) -> None:
    """Rank 0 decided the job id; each rank's spool (another host) is synced on its own."""
    for rank in range(3):
        spool = Spool(tmp_path / f"host{rank}")
        spooled_window(
            spool,
            spool.new_session_dir(),
            0,
            job_id="job-1234",
            experiment_name="offline-ddp",
            traces_only=rank != 0,
        )
    runs = set()
    for rank in (2, 0, 1):
        report = upload_pending(str(tmp_path / f"host{rank}"))
        assert not report.failed
        runs.update(run for _, run in report.uploaded)
    (run_id,) = runs
    run = MlflowClient().get_run(run_id)
    assert run.data.tags[JOB_TAG] == "job-1234"
    assert run.data.metrics["profile/op/op00000/cpu_time_us"] == 0.0


def test_windows_of_one_session_without_a_run_sync_into_one_run(tmp_path) -> None:
    spool = Spool(tmp_path / "spool")
    session = spool.new_session_dir()
    for first in (0, 10):
        spooled_window(spool, session, first)
    report = upload_pending(str(tmp_path / "spool"))
    assert len({run for _, run in report.uploaded}) == 1
    assert len(report.uploaded) == 2
