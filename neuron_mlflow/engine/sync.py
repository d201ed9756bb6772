"""``sync``: upload the spool's pending windows, summarising first any that never were.

A live window is in the spool (manifest and trace, ``"summarised": false``) before the
background worker summarises it. When the process ends in between (a crash, a kill, an exit
drain that ran out of time), :func:`sync_pending` summarises the window from its trace with
the same engine and the same code as the worker (:func:`~neuron_mlflow.engine.finish.
summarise_window`), then uploads it: the same trace gives the same metrics either way.

Example:
    >>> import tempfile
    >>> sync_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

import socket
from pathlib import Path

from neuron_mlflow.capture.backends import BACKENDS
from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.environment import TAG_PREFIX
from neuron_mlflow.engine.finish import FinishJob, summarise_window
from neuron_mlflow.engine.window import WindowSpec
from neuron_mlflow.errors import NeuronMlflowError
from neuron_mlflow.schedule import Window
from neuron_mlflow.sinks.pending import SyncReport, upload_pending
from neuron_mlflow.sinks.spool import Spool, WindowRecord

__all__ = ["summarise_spooled", "sync_pending"]

_NEEDED = ("artifact_path", "prefix", "document", "backend", "trace_dir", "window")


def summarise_spooled(record: WindowRecord) -> None:
    """Summarise a spooled window that was never summarised, from its own trace.

    Its metrics go into the manifest and its summary files (``summary.md``, ``ops.csv``,
    ``summary.json``, ``report.html``, ``config.json``) next to its traces, as the worker
    would have written them.

    Raises:
        NeuronMlflowError: the manifest lacks what the summary needs (written by an older version).
        TraceFormatError: the window's trace is truncated or malformed.
    """
    manifest = record.manifest
    missing = [key for key in _NEEDED if key not in manifest]
    if missing:
        raise NeuronMlflowError(
            f"the window at {record.path} was never summarised and its manifest lacks "
            f"{', '.join(missing)}; summarise its trace with `neuron-mlflow ingest`"
        )
    document = manifest["document"]
    config = ProfilerConfig.model_validate(document["config"])
    facts = manifest["window"]
    window = Window(facts["index"], facts["first"], facts["first"], facts["last"])
    backend = BACKENDS[manifest["backend"]](config)  # summarising needs no device
    backend.restore(
        {
            key.removeprefix(TAG_PREFIX): value
            for key, value in (manifest.get("tags") or {}).items()
            if key.startswith(TAG_PREFIX)
        }
    )
    capture = LiveWindow(
        window,
        backend,
        config,
        staging=record.path,
        trace_dir=record.artifacts_dir / Path(manifest["trace_dir"]),
        recorded_steps=int(manifest.get("steps") or 0),
        last_recorded=facts["last"],
        wall_ns=round(float(manifest.get("wall_time_us") or 0.0) * 1000),
    )
    session_dir = next(
        (p for p in record.path.parents if p.name == manifest.get("session")), record.path.parent
    )
    here, there = socket.gethostname(), manifest.get("tags", {}).get(f"{TAG_PREFIX}host")
    job = FinishJob(
        capture,
        manifest["prefix"],
        Spool(session_dir.parent),
        session_dir,
        status=record.status,
        partial=bool(facts.get("partial")),
        rank=int(manifest.get("rank") or 0),
        world_size=int(manifest.get("world_size") or 1),
        rank_metrics=bool(manifest.get("rank_metrics")),
        traces_only=bool(manifest.get("traces_only")),
        record=record,
        # Explorer, the chip's peak and the core count are read from the host it runs on
        device_analysis=there in (None, here),
    )
    job.spec = WindowSpec(
        strict=config.strict,
        run_id=manifest.get("run_id"),
        prefix=manifest["prefix"],
        index=facts["index"],
        first=facts["first"],
        last=facts["last"],
        summary=None,
        partial=bool(facts.get("partial")),
        top_k=config.top_k,
        params=dict(manifest.get("params") or {}),
        tags=dict(manifest.get("tags") or {}),
        metric_step=manifest.get("metric_step"),
        document=document,
        status="incomplete" if record.status == "incomplete" else "pending",
        error=manifest.get("error"),
        traces_only=bool(manifest.get("traces_only")),
    )
    if not job.device_analysis and job.capture.backend.name == "neuron":
        document.setdefault("errors", []).append(
            f"device analysis (Explorer summary, MFU, verdict) skipped: summarised by sync on "
            f"{here}, not on the training host {there}, whose chip, cores and tools it reads"
        )
    summarise_window(job)


def sync_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
) -> SyncReport:
    """Upload every pending window of the spool at ``local_dir`` exactly once; mark it done.

    A window spooled but never summarised is summarised from its trace first
    (:func:`summarise_spooled`); one whose summary fails is reported in ``failed`` with the
    reason and stays in the spool, traces and all. Everything else is
    :func:`~neuron_mlflow.sinks.pending.upload_pending`: each window into its original
    run when that exists on the server, else into its job's run.

    Args:
        local_dir: the spool folder (``ProfilerConfig.local_dir``).
        tracking_uri: target server; ``None`` means what MLflow resolves now.
        include_incomplete: also upload windows interrupted by an exception.

    Returns:
        A :class:`~neuron_mlflow.sinks.pending.SyncReport`.

    Raises:
        ConnectionError: the tracking server is not reachable (nothing was uploaded).
    """
    return upload_pending(local_dir, tracking_uri, include_incomplete, summarise_spooled)
