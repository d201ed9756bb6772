"""Finishing a live window: spooled on the training thread, summarised and uploaded off it.

When the profiler has stopped and the backend has written the window's trace, the session
calls :func:`spool_live` (manifest and traces into the spool: a rename and a small file),
then hands :func:`finish_window` (summary, summary files, upload) to the background worker.

Example:
    >>> import tempfile, time, torch
    >>> from neuron_mlflow.capture.backends import resolve_backend
    >>> from neuron_mlflow.capture.live import LiveWindow
    >>> from neuron_mlflow.config import ProfilerConfig, Schedule
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
    >>> result = finish_window(FinishJob(live, "profile", spool, session_dir, upload=False))
    >>> result.record.status, result.summary.steps
    ('pending', 1)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.capture.profile_reader import CapturedStats
from neuron_mlflow.engine.environment import environment_tags
from neuron_mlflow.engine.guard import guarded
from neuron_mlflow.engine.upload import RunTarget, upload_window
from neuron_mlflow.engine.window import WindowSpec, spool_window, write_summary
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.naming import param_key
from neuron_mlflow.sinks.mlflow_sink import JOB_TAG
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.summary.ops import OpSummary, build_summary

T = TypeVar("T")


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


@dataclass
class FinishResult:
    """A finished window: its spooled record, summary and run (``None`` where none)."""

    record: WindowRecord | None
    summary: OpSummary | None
    run_id: str | None


class Results:
    """A session's finished windows, published by the worker thread, awaited by the session.

    Example:
        >>> from concurrent.futures import Future
        >>> results = Results()
        >>> done: Future = Future()
        >>> _ = results.track(done); done.set_result(None)
        >>> results.wait(1.0, strict=True), results.records
        (True, [])
    """

    def __init__(self) -> None:
        self.summary: OpSummary | None = None
        self.run_id: str | None = None
        self.records: list[WindowRecord] = []
        self._jobs: list[Future[Any]] = []
        self._summaries: list[Future[Any]] = []

    def track(self, job: Future[T], summarised: Future[Any] | None = None) -> Future[T]:
        """Remember ``job`` so that :meth:`wait` waits for it; ``summarised`` is set when its
        summary is published (before the upload), for :meth:`wait` with ``summaries_only``."""
        self._jobs.append(job)
        self._summaries.append(summarised if summarised is not None else job)
        return job

    def publish(self, result: FinishResult) -> WindowRecord | None:
        """Record a finished window's results (on the worker thread); a record already
        published (at its summary) is not added twice."""
        if result.record is not None and not any(r is result.record for r in self.records):
            self.records.append(result.record)
            self.summary = result.summary
        if result.run_id is not None:
            self.run_id = result.run_id
        return result.record

    def wait(self, timeout_s: float, strict: bool, summaries_only: bool = False) -> bool:
        """Wait for every tracked job, at most ``timeout_s``; True when none is left.

        With ``summaries_only`` wait until each job's summary is published, not its upload.
        A job's exception is raised when ``strict`` (else it was already a warning).
        """
        deadline = time.monotonic() + timeout_s
        jobs = self._summaries if summaries_only else self._jobs
        for job in list(jobs):
            try:
                job.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
            except Exception:
                jobs.remove(job)
                if strict:
                    raise
                continue
            jobs.remove(job)
        return True


def summarise_live(capture: LiveWindow, partial: bool) -> tuple[OpSummary, str | None]:
    """The window's op summary, and which source gave its device time (a run tag)."""
    stats = capture.stats or CapturedStats()
    stats, device_time_source = capture.backend.refine_device_time(stats, capture.trace_dir)
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
    tags = dict(job.environment)
    errors = [*capture.errors, *([job.error] if job.error else [])]
    document = {"config": config.model_dump(mode="json"), "environment": tags, "errors": errors}
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
        params={param_key(job.prefix, k): v for k, v in config.flat_params().items()},
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
            "tracking_uri": None,
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
    write_summary(job.record, job.spec)
    return summary


def _device_analysis(job: FinishJob, summary: OpSummary) -> OpSummary:
    """A backend's analysis after the window (Neuron: Explorer's summary, MFU, the verdict,
    the busy share): its metrics, tags and files join the window; a failure never fails it."""
    analyze = getattr(job.capture.backend, "analyze_window", None)
    assert job.spec is not None and job.record is not None
    if analyze is None or not job.device_analysis:
        return summary
    found = guarded(
        job.capture.config.strict,
        analyze,
        job.prefix,
        summary,
        job.capture.trace_dir,
        job.record.artifacts_dir,
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


def finish_window(
    job: FinishJob, on_summary: Callable[[FinishResult], Any] | None = None
) -> FinishResult:
    """On the worker: summarise the spooled window and (unless told not to) upload it.

    ``on_summary`` receives the result as soon as the summary is written, before the upload
    (so the summary never waits on the network). Our failures become one
    :class:`~neuron_mlflow.errors.NeuronMlflowWarning` (the window stays in the spool with its
    traces), unless the configuration is strict. Then this process's claim on the window is
    given up (:mod:`neuron_mlflow.sinks.claims`): from here on ``sync`` may take it.
    """
    try:
        return _finish(job, on_summary)
    finally:
        if job.record is not None:
            job.record.release()


def _finish(job: FinishJob, on_summary: Callable[[FinishResult], Any] | None) -> FinishResult:
    capture, config = job.capture, job.capture.config
    try:
        if job.record is None:
            spool_live(job)
        record = job.record
        assert record is not None
        summary = summarise_window(job)
    except Exception as exc:
        if config.strict:
            raise
        where = job.record.path if job.record is not None else capture.staging
        warnings.warn(
            f"neuron-mlflow: could not write the window's summary ({type(exc).__name__}: "
            f"{exc}); its raw capture is kept at {where}",
            NeuronMlflowWarning,
            stacklevel=2,
        )
        return FinishResult(None, None, None)
    if on_summary is not None:
        on_summary(FinishResult(record, summary, None))
    if job.status == "incomplete":
        warnings.warn(
            f"neuron-mlflow: the profiled code raised ({job.error}); what was captured is kept "
            f"at {record.path} (incomplete, not uploaded; "
            "`neuron-mlflow sync --include-incomplete` uploads it)",
            NeuronMlflowWarning,
            stacklevel=2,
        )
        return FinishResult(record, summary, None)
    run_id = None
    if job.upload:
        target = job.target or RunTarget()
        tags = dict(job.environment)  # read once, on the training thread, by spool_live
        if job.job_id:
            tags[JOB_TAG] = job.job_id  # sync finds this run for the job's other ranks
        run_id = upload_window(record, target, config, tags, job.active_run)
    return FinishResult(record, summary, run_id)
