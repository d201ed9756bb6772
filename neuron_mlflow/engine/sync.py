"""``sync``: finish the spool's windows that no worker process finished.

A live window's record is queued for the worker process when the window ends; the worker
puts it in place and finishes it. When the worker does not get to it (a crash before the
worker started, a worker out of time), :func:`sync_pending` puts it in place the same way
(:func:`place_queued`, with :meth:`~neuron_mlflow.sinks.spool.Spool.place`), then finishes
every pending window with the worker's pipeline
(:func:`~neuron_mlflow.engine.pipeline.finish_window`: summary, files, upload, clean-up):
the same trace gives the same metrics either way.

Example:
    >>> import tempfile
    >>> sync_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

from pathlib import Path

from neuron_mlflow.engine.pipeline import finish_window
from neuron_mlflow.engine.worker import queued_place, read_job
from neuron_mlflow.sinks.claims import QUEUE, worker_running
from neuron_mlflow.sinks.pending import SyncReport, upload_pending
from neuron_mlflow.sinks.spool import Spool

__all__ = ["place_queued", "sync_pending"]


def place_queued(local_dir: str | Path) -> SyncReport:
    """Put in place the queued windows still staged (their process ended before its worker
    placed them), unless a worker runs: it does that itself (those go to ``busy``). One that
    cannot be placed goes to ``failed`` with the reason; its capture stays where it is.

    Example:
        >>> import tempfile
        >>> place_queued(tempfile.mkdtemp()).busy
        []
    """
    root = Path(local_dir)
    spool = Spool(root)
    report = SyncReport()
    queue = root / QUEUE
    jobs = sorted(queue.glob("*.json")) if queue.is_dir() else []
    running = bool(jobs) and worker_running(root)
    for path in jobs:
        try:
            window = read_job(root, path)
        except (OSError, ValueError) as exc:
            if path.exists():
                report.failed.append((str(path), f"{type(exc).__name__}: {exc}"))
            continue
        if not spool.staged_dir(window).is_dir():
            continue  # in place already
        if running:
            report.busy.append(str(queued_place(root, window)))
            continue
        try:
            spool.place(window)
        except OSError as exc:
            reason = f"{type(exc).__name__}: {exc}; its capture stays at {spool.staged_dir(window)}"
            report.failed.append((str(queued_place(root, window)), reason))
    return report


def sync_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
) -> SyncReport:
    """Upload every pending window of the spool at ``local_dir`` exactly once; mark it done.
    Queued windows not yet in place are put in place first (:func:`place_queued`).

    Each window goes through the worker's pipeline: one never summarised is summarised from
    its trace first; one whose summary fails is reported in ``failed`` with the reason and
    stays in the spool, traces and all. Each window goes into its original run when that
    exists on the server, else into its job's run
    (:meth:`~neuron_mlflow.sinks.mlflow_sink.MlflowSink.run_for`).

    Args:
        local_dir: the spool folder (``ProfilerConfig.local_dir``).
        tracking_uri: target server; ``None`` means what MLflow resolves now.
        include_incomplete: also upload windows interrupted by an exception.

    Returns:
        A :class:`~neuron_mlflow.sinks.pending.SyncReport`.

    Raises:
        ConnectionError: the tracking server is not reachable (nothing was uploaded).
    """
    placed = place_queued(local_dir)
    report = upload_pending(local_dir, tracking_uri, include_incomplete, finish_window)
    report.busy.extend(placed.busy)
    report.failed.extend(placed.failed)
    return report
