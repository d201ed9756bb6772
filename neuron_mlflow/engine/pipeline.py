"""One pipeline for every window: summarise -> write files -> upload -> clean up.

:func:`finish_window` reads the window's record and nothing else, so the worker process and
``sync`` give the same trace the same numbers (docs/spool.md).

Example:
    >>> import tempfile
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> spool = Spool(tempfile.mkdtemp())
    >>> record = spool.create_window(spool.new_session_dir(), "profile/step_000000-000000",
    ...                              summarised=False, prefix="profile", backend="cpu",
    ...                              config=ProfilerConfig(backend="cpu"),
    ...                              trace_dir="traces/rank_0", steps=1, wall_time_us=10.0,
    ...                              window={"index": 0, "first": 0, "last": 0})
    >>> finish_window(record).steps, record.window.state.value
    (1, 'summarised')
"""

from __future__ import annotations

import json
import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from neuron_mlflow.capture.backends import BACKENDS
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.guard import Guard
from neuron_mlflow.errors import NeuronMlflowError, NeuronMlflowWarning
from neuron_mlflow.naming import (
    DEVICE_TIME_SOURCE_TAG,
    TAG_PREFIX,
    busy_metric,
    op_keys,
    rank_metrics,
    window_metrics,
)
from neuron_mlflow.sinks.spool import WindowRecord
from neuron_mlflow.sinks.spool_cleanup import cleanup_after_upload
from neuron_mlflow.sinks.window_record import WindowFacts
from neuron_mlflow.summary.ops import OpSummary, build_summary
from neuron_mlflow.summary.tables import render_csv, render_markdown
from neuron_mlflow.trace.step_samples import write_step_samples
from neuron_mlflow.trace.window_report import write_window_report

if TYPE_CHECKING:
    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

__all__ = ["WindowFailed", "clean_up", "finish_window", "summarise_window", "write_files"]


class WindowFailed(NeuronMlflowError):
    """A step of the pipeline failed for one window; its record says which and why."""


def finish_window(
    record: WindowRecord, sink: MlflowSink | None = None, run_id: str | None = None
) -> OpSummary | None:
    """Summarise, write the files, upload and clean up one window in place (each step once:
    what its record says is done is skipped). The worker process and ``sync`` both call it.

    Args:
        record: the window, claimed by this process.
        sink: the tracking server (``None``: no upload, the window stays pending).
        run_id: the run (``None``: the sink chooses, :meth:`MlflowSink.run_for`).

    Returns:
        The summary made now (``None`` when the window was summarised before).

    Raises:
        WindowFailed: the summary or the upload failed; the record says so (``failed``, or
            ``error`` with ``failed_step="upload"``: pending for ``sync``).
    """
    summary = None
    if not record.window.summarised:
        try:
            summary = summarise_window(record)
        except Exception as exc:
            message = (
                f"summarising the window from its trace failed ({type(exc).__name__}: "
                f"{exc}); its traces stay at {record.artifacts_dir}"
            )
            record.reload()  # not the summary's half-made changes
            record.failed(message)
            raise WindowFailed(message) from exc
    if sink is None or record.status == "done":
        return summary
    try:
        if record.window.tracking_uri != sink.tracking_uri:
            record.update(tracking_uri=sink.tracking_uri)
        sink.check_reachable()
        sink.upload(record, run_id or sink.run_for([record]))
    except Exception as exc:
        message = (
            f"could not log the profiling window to MLflow at {sink.tracking_uri} "
            f"({type(exc).__name__}: {str(exc)[:300]})"
        )
        record.upload_failed(message)
        raise WindowFailed(message) from exc
    clean_up(record)
    return summary


def clean_up(record: WindowRecord) -> None:
    """After MLflow confirmed the (claimed) window: its traces leave the spool unless
    ``keep_local``, and the spool is held to ``local_max_bytes``."""
    config = record.window.config
    keep_local, cap = (config.keep_local, config.local_max_bytes) if config else (False, None)
    cleanup_after_upload(record.path, keep_local, cap)


def summarise_window(record: WindowRecord) -> OpSummary:
    """Summarise a window in place from its own trace: its metrics into its record (state
    ``summarised``, or ``incomplete``) and its files (:func:`write_files`).

    Raises:
        NeuronMlflowError: the record lacks what the summary needs (an older release).
        TraceFormatError: the window's trace is truncated or malformed.
    """
    window = record.window
    needed = ("prefix", "backend", "trace_dir", "facts", "config")
    missing = [name for name in needed if not getattr(window, name)]
    if missing or window.prefix is None or window.facts is None or window.config is None:
        raise NeuronMlflowError(
            f"the window at {record.path} was never summarised and its record lacks "
            f"{', '.join(missing)}; summarise its trace with `neuron-mlflow ingest`"
        )
    config: ProfilerConfig = window.config
    backend = BACKENDS[str(window.backend)](config)  # summarising needs no device
    backend.restore(
        {k.removeprefix(TAG_PREFIX): v for k, v in window.tags.items() if k.startswith(TAG_PREFIX)}
    )
    environment = dict(window.tags)
    trace_dir = record.artifacts_dir / Path(window.trace_dir or "")
    stats, source = backend.refine_device_time(trace_dir)
    summary = stats.summary
    if summary is None:  # no trace to read: the window's own step count and wall time
        summary = build_summary([], 0, window.steps, window.wall_time_us, backend.device_label)
    summary = summary.with_partial(window.facts.partial)
    if source is not None:
        window.tags[DEVICE_TIME_SOURCE_TAG] = source
    busy, extra = stats.device_busy_pct, {}
    here, there = socket.gethostname(), window.tags.get(f"{TAG_PREFIX}host")
    if there in (None, here):  # Explorer, the chip's peak and core count: this host's
        found = Guard(config.strict)(
            backend.analyze_window, window.prefix, summary, trace_dir, record.artifacts_dir, stats
        )
        if found is not None:  # a failure never fails the window
            summary = found.summary
            extra.update(found.metrics)
            window.tags.update(found.tags)
            for error in found.errors:
                window.errors.append(error)
                warnings.warn(f"neuron-mlflow: {error}", NeuronMlflowWarning, stacklevel=2)
    elif backend.name == "neuron":
        window.errors.append(
            f"device analysis (Explorer summary, MFU, verdict) skipped: summarised by sync on "
            f"{here}, not on the training host {there}, whose chip, cores and tools it reads"
        )
    document = {
        "config": config.model_dump(mode="json"),
        "reason": window.reason,
        "environment": environment,
        "errors": window.errors,
    }
    write_files(record, summary, config.top_k, document, strict=config.strict)
    if window.traces_only:  # rank 0 logs the window's metrics; this rank its own times
        metrics: dict[str, float] = {}
    else:  # (after the files: steps.jsonl's _p50/_iqr metrics are in the summary now)
        metrics = window_metrics(summary, window.prefix, config.top_k)
        if busy is not None and summary.device_time_us is not None:
            metrics[busy_metric(window.prefix)] = busy
        metrics.update(extra)
    if window.world_size > 1 or window.rank_metrics:  # each rank logs its own: no collective
        metrics.update(rank_metrics(window.prefix, window.rank, summary))
    record.summarised(metrics, incomplete=window.status == "incomplete")
    return summary


def write_files(
    record: WindowRecord,
    summary: OpSummary,
    top_k: int,
    document: dict[str, Any],
    title: str | None = None,
    strict: bool = False,
) -> None:
    """A summarised window's files next to its traces: ``summary.md``, ``ops.csv``,
    ``summary.json`` (``document``'s entries, the window's prefix and steps, the summary),
    ``op_keys.json``, ``config.json`` (``document["config"]``, when given), ``steps.jsonl``
    (its ``_p50``/``_iqr`` metrics join ``summary.extra``) and ``report.html`` (a failure of
    either never fails the window, unless ``strict`` for the report)."""
    window, artifacts = record.window, record.artifacts_dir
    facts = window.facts or WindowFacts(index=0, first=0, last=0)
    prefix = str(window.prefix)
    title = title or f"{prefix}: steps {facts.first}-{facts.last}"
    full = {"prefix": prefix, "window": msgspec.to_builtins(facts), **document}
    keys = op_keys(op.name for op in summary.ops)
    files = {
        "summary.md": render_markdown(summary, title=title),
        "summary.json": json.dumps({**full, "summary": summary.to_dict()}, indent=2, default=str),
        "ops.csv": render_csv(summary, keys),
        "op_keys.json": json.dumps(
            {key: name for name, key in keys.items()}, indent=2, sort_keys=True
        ),
    }
    if document.get("config") is not None:
        files["config.json"] = json.dumps(document["config"], indent=2, sort_keys=True, default=str)
    for name, text in files.items():
        (artifacts / name).write_text(text, encoding="utf-8")
    samples = Guard(False)(write_step_samples, artifacts, artifacts / "traces", top_k)
    summary.extra.update(samples or {})
    Guard(strict)(write_window_report, artifacts, summary, record.manifest, window.run_id)
