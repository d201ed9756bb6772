"""Finishing a live window: spooled on the training thread, summarised by the worker process.

When the profiler has stopped and the backend has written the window's trace, the session
calls :func:`spool_live` (manifest and traces into the spool: a rename and a small file) and
queues the window for the worker process (:mod:`neuron_mlflow.engine.worker`), which
summarises it with :func:`summarise_window` (through
:func:`~neuron_mlflow.engine.sync.summarise_spooled`, as ``sync`` does) and uploads it.

Example:
    >>> import tempfile, time, torch
    >>> from neuron_mlflow.capture.backends import resolve_backend
    >>> from neuron_mlflow.capture.live import LiveWindow
    >>> from neuron_mlflow.config import ProfilerConfig, Schedule
    >>> from neuron_mlflow.engine.sync import summarise_spooled
    >>> from neuron_mlflow.schedule import window_at
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> cfg = ProfilerConfig(backend="cpu", schedule=Schedule(warmup=0, active=1))
    >>> spool = Spool(tempfile.mkdtemp())
    >>> session_dir = spool.new_session_dir()
    >>> staging = Spool.capture_dir(session_dir, 0)
    >>> live = LiveWindow(window_at(cfg.schedule, 0), resolve_backend("cpu", cfg), cfg,
    ...                   staging, staging / "artifacts" / "traces" / "rank_0")
    >>> live.start(); _ = torch.ones(4) * 2
    >>> live.record_step(0, time.perf_counter_ns()); live.step(); live.stop()
    >>> job = FinishJob(live, "profile", spool, session_dir)
    >>> spool_live(job)
    >>> job.record.manifest["summarised"]
    False
    >>> summarise_spooled(job.record); job.record.release()
    >>> job.record.manifest["metrics"]["profile/steps"]
    1.0
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.capture.profile_reader import CapturedStats
from neuron_mlflow.engine.environment import environment_tags
from neuron_mlflow.engine.guard import guarded
from neuron_mlflow.engine.host_load import host_load_tags, sample_host_load
from neuron_mlflow.engine.upload import RunTarget
from neuron_mlflow.engine.window import WindowSpec, spool_window, write_summary
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.naming import param_key, rank_metrics, reason_tag, window_artifact_path
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.summary.ops import OpSummary, build_summary


@dataclass
class FinishJob:
    """What the worker needs to finish one live window (decided on the training thread).

    Attributes:
        capture: the stopped window (its trace is in ``capture.staging``).
        prefix: the metric prefix ``P``.
        spool: the spool; ``session_dir`` the session's folder in it.
        status: ``pending`` or ``incomplete`` (the user's step raised).
        partial: the window ended before its last scheduled step.
        error: the user's exception, for an incomplete window.
        rank: this process's global rank; ``world_size`` how many there are.
        metric_step: the MLflow step of the window's metrics (default: its last step).
        traces_only: upload only the traces (ranks other than 0).
        upload: upload after spooling.
        target: which run; ``active_run`` the run active when the window ended.
        record: the spooled window (set by :func:`spool_live`); ``spec`` what it is made of.
        environment: the run tags of versions, host and rank (set by :func:`spool_live`).
        job_id: the job's id (decided once by rank 0), so that every rank's windows of an
            offline job sync into one run.
        device_analysis: run the backend's analysis (off where it would read another host).
        rank_metrics: log this rank's own times (``P/rank/<r>/...``; always in a job of
            several ranks).
    """

    capture: LiveWindow
    prefix: str
    spool: Spool
    session_dir: Path
    status: str = "pending"
    partial: bool = False
    error: str | None = None
    rank: int = 0
    world_size: int = 1
    metric_step: int | None = None
    traces_only: bool = False
    upload: bool = True
    target: RunTarget | None = None
    active_run: str | None = None
    record: WindowRecord | None = None
    spec: WindowSpec | None = None
    environment: dict[str, str] = field(default_factory=dict)
    job_id: str | None = None
    device_analysis: bool = True
    rank_metrics: bool = False


def summarise_live(capture: LiveWindow, partial: bool) -> tuple[OpSummary, str | None]:
    """The window's op summary, and which source gave its device time (a run tag)."""
    stats = capture.stats or CapturedStats()
    stats, device_time_source = capture.backend.refine_device_time(stats, capture.trace_dir)
    capture.stats = stats  # with the backend's per-window state, for its device analysis
    capture.device_busy_pct = stats.device_busy_pct
    if stats.summary is not None:  # read from the window's own trace (the trace engine)
        return stats.summary.with_partial(partial), device_time_source
    summary = build_summary(
        stats.cpu_ops,
        top_level_calls=stats.top_level_calls,
        steps=capture.recorded_steps,
        wall_time_us=capture.wall_ns / 1000.0,
        device_label=capture.backend.device_label,
        device_rows=stats.device_rows,
    ).with_partial(partial)
    return summary, device_time_source


def spool_live(job: FinishJob) -> None:
    """On the training thread: put the stopped window into the spool (manifest + traces).

    Sets ``job.record`` and ``job.spec``; the summary is added later by :func:`finish_window`.
    """
    capture, config = job.capture, job.capture.config
    job.environment = environment_tags(capture.backend.describe(), job.rank, job.world_size)
    if capture.host_load is not None:  # what makes timings noisy on a shared host
        job.environment.update(host_load_tags(capture.host_load, sample_host_load()))
    tags = dict(job.environment)
    window_path = window_artifact_path(job.prefix, capture.window.first, capture.last_recorded)
    tags[reason_tag(window_path)] = capture.reason
    errors = [*capture.errors, *([job.error] if job.error else [])]
    document = {
        "config": config.model_dump(mode="json"),
        "environment": tags,
        "errors": errors,
        "reason": capture.reason,
    }
    job.spec = WindowSpec(
        strict=config.strict,
        run_id=(job.target or RunTarget()).known_run(job.active_run),
        prefix=job.prefix,
        index=capture.window.index,
        first=capture.window.first,
        last=capture.last_recorded,
        summary=None,
        partial=job.partial,
        top_k=config.top_k,
        params={
            param_key(job.prefix, k): v
            for k, v in config.applicable_params(capture.backend.name).items()
        },
        tags=tags,
        metric_step=job.metric_step,
        staged=capture.staging,
        document=document,
        status="incomplete" if job.status == "incomplete" else "pending",
        error="; ".join(errors) or None,
        manifest={
            "traces_only": job.traces_only,
            "job_id": job.job_id,  # every rank's windows of one job sync into one run
            "experiment_name": config.experiment_name,
            "run_name": config.run_name,
            "upload_traces": config.upload_traces,
            "tracking_uri": _tracking_uri(job.target),
            "run_id": (job.target or RunTarget()).known_run(job.active_run),
            "experiment_id": _active_experiment_id(config.experiment_name),
            "rank": job.rank,
            "world_size": job.world_size,
            "rank_metrics": job.rank_metrics,
            "reason": capture.reason,  # schedule, request <id>, slow steps: 1.7x median
            "steps": capture.recorded_steps,
            "wall_time_us": capture.wall_ns / 1000.0,
            # what `sync` needs to summarise the window when this process ends first
            "prefix": job.prefix,
            "document": document,
            "backend": capture.backend.name,
            "trace_dir": capture.trace_dir.relative_to(capture.staging / "artifacts").as_posix(),
        },
    )
    job.record = spool_window(job.spool, job.session_dir, job.spec, claimed=True)
    capture.trace_dir = job.record.artifacts_dir / capture.trace_dir.relative_to(
        capture.staging / "artifacts"
    )


def _tracking_uri(target: RunTarget | None) -> str | None:
    """The tracking URI the worker process uploads to: the session's, else the one MLflow
    resolves in this process (``mlflow.set_tracking_uri``) when MLflow is imported; else
    ``None`` (the worker resolves it from the same environment and folder)."""
    if target is not None and target.tracking_uri:
        return target.tracking_uri
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        return str(mlflow.get_tracking_uri())
    except Exception:
        return None


def _active_experiment_id(experiment_name: str | None) -> str | None:
    """The experiment set in this process with ``mlflow.set_experiment`` (the worker process
    cannot see it), when the config names none."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if experiment_name or fluent is None:
        return None
    active = getattr(fluent, "_active_experiment_id", None)
    return str(active) if active else None


def summarise_window(job: FinishJob) -> OpSummary:
    """Summarise the spooled window ``job.record`` from its trace and write its summary files
    and metrics (:func:`~neuron_mlflow.engine.window.write_summary`); the live worker and
    ``sync`` (for a window spooled by a process that ended before this ran) both call it."""
    assert job.spec is not None and job.record is not None
    summary, device_time_source = summarise_live(job.capture, job.partial)
    job.spec.device_busy_pct = job.capture.device_busy_pct
    if device_time_source is not None:
        job.spec.tags["neuron_mlflow.device_time_source"] = device_time_source
        job.record.manifest["tags"]["neuron_mlflow.device_time_source"] = device_time_source
    summary = _device_analysis(job, summary)
    job.spec.summary = summary
    if job.world_size > 1 or job.rank_metrics:  # each rank logs its own: no collective
        job.spec.rank_metrics = rank_metrics(job.prefix, job.rank, summary)
    write_summary(job.record, job.spec)
    return summary


def _device_analysis(job: FinishJob, summary: OpSummary) -> OpSummary:
    """A backend's analysis after the window (Neuron: Explorer's summary, MFU, the verdict,
    the busy share): its metrics, tags and files join the window; a failure never fails it."""
    assert job.spec is not None and job.record is not None
    if not job.device_analysis:
        return summary
    found = guarded(
        job.capture.config.strict,
        job.capture.backend.analyze_window,
        job.prefix,
        summary,
        job.capture.trace_dir,
        job.record.artifacts_dir,
        job.capture.stats or CapturedStats(),
    )
    if found is None:
        return summary
    if found.device_busy_pct is not None:
        job.spec.device_busy_pct = found.device_busy_pct
    job.spec.extra_metrics.update(found.metrics)
    job.spec.tags.update(found.tags)
    job.record.manifest["tags"].update(found.tags)
    for error in found.errors:
        job.spec.document.setdefault("errors", []).append(error)
        warnings.warn(f"neuron-mlflow: {error}", NeuronMlflowWarning, stacklevel=2)
    return found.summary
