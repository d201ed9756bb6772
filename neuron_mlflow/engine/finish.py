"""A window's end on the training thread: :func:`end_record` completes the session's part
(:func:`session_record`) into the window's one record, with no MLflow call; the session
queues it for the worker (docs/ARCHITECTURE.md).

Example:
    >>> import tempfile, time, torch
    >>> from neuron_mlflow.capture.backends import resolve_backend
    >>> from neuron_mlflow.capture.live import LiveWindow
    >>> from neuron_mlflow.config import ProfilerConfig, Schedule
    >>> from neuron_mlflow.engine.pipeline import finish_window
    >>> from neuron_mlflow.schedule import window_at
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> cfg = ProfilerConfig(backend="cpu", schedule=Schedule(warmup=0, active=1))
    >>> spool = Spool(tempfile.mkdtemp())
    >>> session_dir = spool.new_session_dir()
    >>> staging = Spool.capture_dir(session_dir, 0)
    >>> backend = resolve_backend("cpu", cfg)
    >>> live = LiveWindow(window_at(cfg.schedule, 0), backend, cfg,
    ...                   staging, staging / "artifacts" / "traces" / "rank_0")
    >>> live.start(); _ = torch.ones(4) * 2
    >>> live.record_step(0, time.perf_counter_ns()); live.step(); live.stop()
    >>> base = session_record(cfg, backend, "profile", session_dir.name)
    >>> record = spool.place(end_record(base, live, status="pending", partial=False))
    >>> record.window.state.value, record.window.steps
    ('spooled', 1)
    >>> finish_window(record).steps, record.window.state.value
    (1, 'summarised')
"""

from __future__ import annotations

import sys
import time

import msgspec

from neuron_mlflow.capture.backends import BaseBackend
from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.environment import environment_tags
from neuron_mlflow.engine.host_load import host_load_tags, sample_host_load
from neuron_mlflow.naming import param_key, partial_tag, reason_tag, window_artifact_path
from neuron_mlflow.sinks.spool import ARTIFACTS
from neuron_mlflow.sinks.window_record import Window, WindowFacts, WindowState

__all__ = ["end_record", "session_record"]


def session_record(
    config: ProfilerConfig,
    backend: BaseBackend,
    prefix: str,
    session: str,
    *,
    rank: int = 0,
    world_size: int = 1,
    traces_only: bool = False,
    job_id: str | None = None,
    rank_metrics: bool = False,
) -> Window:
    """What every window of a session has in common; :func:`end_record` completes a copy."""
    return Window(
        state=WindowState.SPOOLED,
        artifact_path="",  # known at the end (the last recorded step)
        session=session,
        created="",
        captured_ms=0,
        prefix=prefix,
        backend=backend.name,
        rank=rank,
        world_size=world_size,
        rank_metrics=rank_metrics,
        traces_only=traces_only,
        experiment_name=config.experiment_name,
        run_name=config.run_name,
        job_id=job_id,  # every rank's windows of one job sync into one run
        upload_traces=config.upload_traces,
        params={param_key(prefix, k): v for k, v in config.applicable_params(backend.name).items()},
        config=config,
    )


def end_record(
    base: Window,
    capture: LiveWindow,
    *,
    status: str,
    partial: bool,
    error: str | None = None,
    metric_step: int | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    upload: bool = True,
    skew_ranks: list[int] | None = None,
) -> Window:
    """The window's complete record, once the profiler stopped.

    Args:
        base: the session's part (:func:`session_record`).
        capture: the stopped window.
        status: ``pending`` or ``incomplete`` (the user's step raised).
        partial: it ended before its last scheduled step.
        error: the user's exception, for an incomplete window.
        metric_step: the MLflow step of its metrics (default: its last recorded step).
        run_id: the run known without asking MLflow.
        tracking_uri: the session's server (default: what MLflow resolves in this process).
        upload: the worker uploads it after its summary.
        skew_ranks: rank 0 of a job of several ranks: the ranks of the skew metric.
    """
    # read at every end: a backend's facts can change once its profiler has run
    tags = environment_tags(capture.backend.describe(), base.rank, base.world_size)
    last = capture.last_recorded
    artifact_path = window_artifact_path(str(base.prefix), capture.window.first, last)
    if capture.host_load is not None:  # what makes timings noisy on a shared host
        tags.update(host_load_tags(capture.host_load, sample_host_load()))
    tags[reason_tag(artifact_path)] = capture.reason
    if partial:
        tags[partial_tag(artifact_path)] = "true"
    errors = [*capture.errors, *([error] if error else [])]
    captured_ms = int(time.time() * 1000)  # the metrics' timestamp
    return msgspec.structs.replace(
        base,
        state=WindowState.INCOMPLETE if status == "incomplete" else WindowState.SPOOLED,
        artifact_path=artifact_path,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(captured_ms / 1000)),
        captured_ms=captured_ms,
        trace_dir=capture.trace_dir.relative_to(capture.staging / ARTIFACTS).as_posix(),
        facts=WindowFacts(
            index=capture.window.index, first=capture.window.first, last=last, partial=partial
        ),
        steps=capture.recorded_steps,
        wall_time_us=capture.wall_ns / 1000.0,
        reason=capture.reason,
        run_id=run_id,
        tracking_uri=tracking_uri or _tracking_uri(),
        experiment_id=_active_experiment_id(base.config.experiment_name if base.config else None),
        metric_step=last if metric_step is None else metric_step,
        tags=tags,
        errors=errors,
        error="; ".join(errors) or None,
        upload=upload,
        skew_ranks=skew_ranks,
    )


def _tracking_uri() -> str | None:
    """The tracking URI MLflow resolves here when it is imported, else ``None`` (the worker
    resolves it from the same environment)."""
    mlflow = sys.modules.get("mlflow")
    try:
        return None if mlflow is None else str(mlflow.get_tracking_uri())
    except Exception:
        return None


def _active_experiment_id(experiment_name: str | None) -> str | None:
    """The experiment of ``mlflow.set_experiment`` here (the worker cannot see it), when the
    config names none."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if experiment_name or fluent is None:
        return None
    active = getattr(fluent, "_active_experiment_id", None)
    return str(active) if active else None
