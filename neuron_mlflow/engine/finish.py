"""A window from the profiler to the spool, and from the spool to its summary.

Two halves of one window's life, on two sides of a process boundary:

- On the training thread: :func:`draft_window` when the window opens (its
  :class:`~neuron_mlflow.sinks.window_record.Window` record with what is known then, saved
  beside the trace), :func:`end_facts` once the profiler stopped and the backend wrote its
  trace (the facts go into the worker's job). That is all the training thread does with a
  window. (:func:`spool_live` puts a window ended by an exception, a stage's end or a signal
  in place on the spot, the same way.)
- :func:`place_ended` then :func:`summarise_window`, in the worker process (and in ``sync``
  for a window whose process ended first): the record completed and the window put in
  place (state ``spooled``); then its trace read with the trace engine, the backend's
  device analysis, metrics, summary files and ``report.html`` (state ``summarised``).
  It takes the record and nothing else, so the same trace gives the same numbers wherever
  it is summarised.

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
    >>> record = spool_live(LiveEnd(live, "profile", spool, session_dir))
    >>> record.window.state.value
    'spooled'
    >>> summarise_window(record).steps, record.window.state.value
    (1, 'summarised')
"""

from __future__ import annotations

import socket
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_mlflow.capture.backends import BACKENDS, Backend
from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.capture.profile_reader import CapturedStats
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.end_facts import EndFacts, complete_window
from neuron_mlflow.engine.environment import environment_tags
from neuron_mlflow.engine.guard import guarded
from neuron_mlflow.engine.host_load import sample_host_load
from neuron_mlflow.engine.upload import RunTarget
from neuron_mlflow.engine.window import WindowSpec, write_summary
from neuron_mlflow.errors import NeuronMlflowError, NeuronMlflowWarning
from neuron_mlflow.naming import (
    DEVICE_TIME_SOURCE_TAG,
    TAG_PREFIX,
    param_key,
    rank_metrics,
    window_artifact_path,
)
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.sinks.window_record import Window, WindowState
from neuron_mlflow.summary.ops import OpSummary, build_summary


@dataclass
class LiveEnd:
    """What the training thread knows of a live window: made when the window opens (its
    record is drafted from it then, :func:`draft_window`), completed when it ends.

    Attributes:
        capture: the window (its trace is in ``capture.staging`` once stopped).
        prefix: the metric prefix ``P``.
        spool: the spool; ``session_dir`` the session's folder in it.
        status: ``pending`` or ``incomplete`` (the user's step raised); set at the end.
        partial: the window ended before its last scheduled step; set at the end.
        error: the user's exception, for an incomplete window; set at the end.
        rank: this process's global rank; ``world_size`` how many there are.
        metric_step: the MLflow step of the window's metrics (default: its last step).
        traces_only: a rank other than 0 (it logs its traces and its own rank metrics).
        target: which run; ``active_run`` the run active when the window ended.
        job_id: the job's id (decided once by rank 0), so that every rank's windows of an
            offline job sync into one run.
        rank_metrics: log this rank's own times (``P/rank/<r>/...``; always in a job of
            several ranks).
        draft: the window's record as far as it is known when the window opens (saved in
            the staging folder by the session: ``Spool.save_draft``).
        session_rel, staged_rel: the session's and the staging folder's paths relative
            to the spool root (POSIX), for the worker's job.
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
    target: RunTarget | None = None
    active_run: str | None = None
    job_id: str | None = None
    rank_metrics: bool = False
    draft: Window | None = None
    session_rel: str = ""
    staged_rel: str = ""


def draft_window(end: LiveEnd) -> Window:
    """When a window opens (before its profiler starts, so outside the window): its record
    with everything known then (the config's document and params, the run it goes to by
    name, the rank, the reason). It is completed with the window's :class:`EndFacts`
    (:func:`~neuron_mlflow.engine.end_facts.complete_window`) by the worker process, or
    by :func:`spool_live`."""
    capture, config = end.capture, end.capture.config
    return Window(
        state=WindowState.SPOOLED,
        artifact_path="",  # known at the end (the last recorded step)
        session=end.session_dir.name,
        created="",
        captured_ms=0,
        prefix=end.prefix,
        backend=capture.backend.name,
        trace_dir=capture.trace_dir.relative_to(capture.staging / "artifacts").as_posix(),
        reason=capture.reason,
        rank=end.rank,
        world_size=end.world_size,
        rank_metrics=end.rank_metrics,
        traces_only=end.traces_only,
        experiment_name=config.experiment_name,
        run_name=config.run_name,
        job_id=end.job_id,  # every rank's windows of one job sync into one run
        upload_traces=config.upload_traces,
        params={
            param_key(end.prefix, k): v
            for k, v in _applicable_params(config, capture.backend.name).items()
        },
        document={"config": _config_document(config), "reason": capture.reason},
    )


def end_facts(end: LiveEnd) -> EndFacts:
    """On the training thread, once the profiler stopped: the window's :class:`EndFacts`
    (no MLflow call, nothing written). The worker process completes the record with them
    (:func:`~neuron_mlflow.engine.end_facts.complete_window`)."""
    capture = end.capture
    # read at every window's end: a backend's facts can change once its profiler has run
    # (the Neuron SDK that refuses ``correlate_device_time``)
    environment = environment_tags(capture.backend.describe(), end.rank, end.world_size)
    errors = [*capture.errors, *([end.error] if end.error else [])]
    target = end.target or RunTarget()
    return EndFacts(
        status=end.status,
        partial=end.partial,
        errors=errors,
        index=capture.window.index,
        first=capture.window.first,
        last=capture.last_recorded,
        steps=capture.recorded_steps,
        wall_time_us=capture.wall_ns / 1000.0,
        artifact_path=window_artifact_path(end.prefix, capture.window.first, capture.last_recorded),
        captured_ms=int(time.time() * 1000),  # the metrics' timestamp
        metric_step=capture.last_recorded if end.metric_step is None else end.metric_step,
        reason=capture.reason,
        run_id=target.known_run(end.active_run),
        tracking_uri=_tracking_uri(end.target),
        experiment_id=_active_experiment_id(capture.config.experiment_name),
        environment=environment,
        host_load_open=capture.host_load,  # what makes timings noisy on a shared host
        host_load_end=sample_host_load() if capture.host_load is not None else None,
    )


def spool_live(end: LiveEnd, facts: EndFacts | None = None) -> WindowRecord:
    """Put the stopped window into the spool now (record + traces, state ``spooled``): for
    a window ended by an exception, a stage's end or a signal. (The step that ends a window
    by its schedule only notes its :func:`end_facts`; the worker process places it with
    :func:`place_ended`.) It is not claimed: the record is complete before one rename makes
    it visible, so the worker or a ``sync`` may take it from then on."""
    capture = end.capture
    window = end.draft if end.draft is not None else draft_window(end)
    end.draft = None  # one window, one record
    complete_window(window, facts if facts is not None else end_facts(end))
    record = end.spool.place_window(end.session_dir, window, capture.staging)
    capture.trace_dir = record.artifacts_dir / (window.trace_dir or "")
    return record


def place_ended(staged: Path, place: Path, facts: EndFacts) -> WindowRecord:
    """In the worker process (or ``sync``): complete the record drafted when the window
    opened (saved in ``staged``) with its end ``facts`` and put the window at ``place``.
    A window already in place (by ``sync``, or an earlier try) is read as it is.

    Raises:
        OSError: neither the staged window nor a placed one is there.
        ValueError: the draft does not validate (the message names the file).
    """
    try:
        draft = Spool.load_draft(staged)
    except FileNotFoundError:  # placed already (by `sync`, or an earlier try)
        return WindowRecord.load(place)
    window = complete_window(draft, facts)
    session_dir = staged.parent.parent  # <session>/.capture/window_<n>
    try:
        return Spool(session_dir.parent).place_window(session_dir, window, staged)
    except FileNotFoundError:  # another process placed it meanwhile
        return WindowRecord.load(place)


_CONFIG_CACHE: dict[int, tuple[ProfilerConfig, dict[str, Any], dict[str, dict[str, str]]]] = {}


def _cached(config: ProfilerConfig) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """A config's JSON document and params (it never changes once a session has it): made
    once, not at every window's end."""
    entry = _CONFIG_CACHE.get(id(config))
    if entry is None or entry[0] is not config:
        entry = _CONFIG_CACHE[id(config)] = (config, config.model_dump(mode="json"), {})
    return entry[1], entry[2]


def _config_document(config: ProfilerConfig) -> dict[str, Any]:
    """The config's JSON document, shared by the session's windows (never changed: a record
    is only encoded)."""
    return _cached(config)[0]


def warm_window_constants(config: ProfilerConfig, backend: str) -> None:
    """Make a session's per-window constants (the config's document and params) at set-up,
    so that no window's end pays for them (about 0.3 ms, a tenth of a small window's end).
    The environment tags are not among them: a backend's facts can change once it ran."""
    _config_document(config)
    _applicable_params(config, backend)


def _applicable_params(config: ProfilerConfig, backend: str) -> dict[str, str]:
    params = _cached(config)[1]
    if backend not in params:
        params[backend] = config.applicable_params(backend)
    return params[backend]


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


def summarise_window(record: WindowRecord) -> OpSummary:
    """Summarise a spooled window from its own trace: metrics into its record (state
    ``summarised``, or ``incomplete``), and ``summary.md``, ``ops.csv``, ``summary.json``,
    ``steps.jsonl``, ``report.html``, ``config.json`` next to its traces.

    The worker process calls it for every live window, and ``sync`` for a window whose
    process ended before its worker got to it.

    Raises:
        NeuronMlflowError: the record lacks what the summary needs (an older release).
        TraceFormatError: the window's trace is truncated or malformed.
    """
    window = record.window
    needed = ("prefix", "backend", "trace_dir", "facts")
    missing = [name for name in needed if getattr(window, name) is None]
    missing += [] if window.document.get("config") else ["document.config"]
    if missing or window.prefix is None or window.facts is None or window.backend is None:
        raise NeuronMlflowError(
            f"the window at {record.path} was never summarised and its manifest lacks "
            f"{', '.join(missing)}; summarise its trace with `neuron-mlflow ingest`"
        )
    config = ProfilerConfig.model_validate(window.document["config"])
    backend = BACKENDS[window.backend](config)  # summarising needs no device
    backend.restore(
        {k.removeprefix(TAG_PREFIX): v for k, v in window.tags.items() if k.startswith(TAG_PREFIX)}
    )
    trace_dir = record.artifacts_dir / Path(window.trace_dir or "")
    stats, source = backend.refine_device_time(CapturedStats(), trace_dir)
    summary = stats.summary
    if summary is None:  # no trace to read: the window's own step count and wall time
        summary = build_summary(
            stats.cpu_ops,
            top_level_calls=stats.top_level_calls,
            steps=window.steps,
            wall_time_us=window.wall_time_us,
            device_label=backend.device_label,
            device_rows=stats.device_rows,
        )
    facts = window.facts
    summary = summary.with_partial(facts.partial)
    spec = WindowSpec(
        strict=config.strict,
        run_id=window.run_id,
        prefix=window.prefix,
        index=facts.index,
        first=facts.first,
        last=facts.last,
        summary=summary,
        partial=facts.partial,
        top_k=config.top_k,
        device_busy_pct=stats.device_busy_pct,
        params=window.params,
        tags=window.tags,
        metric_step=window.metric_step,
        document=window.document,
        status="incomplete" if window.status == "incomplete" else "pending",
        error=window.error,
        traces_only=window.traces_only,
    )
    if source is not None:
        window.tags[DEVICE_TIME_SOURCE_TAG] = source
    here, there = socket.gethostname(), window.tags.get(f"{TAG_PREFIX}host")
    if there in (None, here):  # Explorer, the chip's peak and core count: this host's
        spec.summary = summary = _device_analysis(backend, spec, trace_dir, record, stats)
    elif backend.name == "neuron":
        window.document.setdefault("errors", []).append(
            f"device analysis (Explorer summary, MFU, verdict) skipped: summarised by sync on "
            f"{here}, not on the training host {there}, whose chip, cores and tools it reads"
        )
    if window.world_size > 1 or window.rank_metrics:  # each rank logs its own: no collective
        spec.rank_metrics = rank_metrics(window.prefix, window.rank, summary)
    write_summary(record, spec)
    return summary


def _device_analysis(
    backend: Backend,
    spec: WindowSpec,
    trace_dir: Path,
    record: WindowRecord,
    stats: CapturedStats,
) -> OpSummary:
    """A backend's analysis after the window (Neuron: Explorer's summary, MFU, the verdict,
    the busy share): its metrics, tags and files join the window; a failure never fails it."""
    assert spec.summary is not None
    summary = spec.summary
    found = guarded(
        spec.strict,
        backend.analyze_window,
        spec.prefix,
        summary,
        trace_dir,
        record.artifacts_dir,
        stats,
    )
    if found is None:
        return summary
    if found.device_busy_pct is not None:
        spec.device_busy_pct = found.device_busy_pct
    spec.extra_metrics.update(found.metrics)
    spec.tags.update(found.tags)
    for error in found.errors:
        spec.document.setdefault("errors", []).append(error)
        warnings.warn(f"neuron-mlflow: {error}", NeuronMlflowWarning, stacklevel=2)
    return found.summary
