"""``sync``: upload the spool's pending windows, summarising first any that never were.

A live window's trace is in the spool before the step that ended it returns, its end facts
queued for the worker process, which puts it in place (record completed, state
``spooled``) and summarises it. When the worker does not get to it (a crash before the
worker started, a worker out of time), :func:`sync_pending` puts it in place the same way
(:func:`place_ended_windows`), summarises the window from its trace with
the same engine and the same code as the worker (:func:`~neuron_mlflow.engine.finish.
summarise_window`), then uploads it: the same trace gives the same metrics either way.

Example:
    >>> import tempfile
    >>> sync_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

from pathlib import Path

from neuron_mlflow.engine.finish import summarise_window
from neuron_mlflow.engine.worker import UNPLACED_SUFFIX, place_job_window, staged_jobs
from neuron_mlflow.sinks.claims import QUEUE, worker_running
from neuron_mlflow.sinks.pending import SyncReport, upload_pending
from neuron_mlflow.sinks.spool import WindowRecord

__all__ = ["place_ended_windows", "summarise_spooled", "sync_pending"]


def place_ended_windows(local_dir: str | Path) -> SyncReport:
    """Put in place the ended windows still staged, their end facts in the queue (their
    process ended before its worker placed them), unless a worker runs: it does that itself
    (those go to ``busy``). One that cannot be placed goes to ``failed`` with the reason;
    its capture stays where it is.

    Example:
        >>> import tempfile
        >>> place_ended_windows(tempfile.mkdtemp()).busy
        []
    """
    root = Path(local_dir)
    report = SyncReport()
    queue = root / QUEUE
    jobs = [*queue.glob("*.json"), *queue.glob(f"*.json{UNPLACED_SUFFIX}")]
    staged = staged_jobs(root, sorted(jobs))
    if staged and worker_running(root):
        report.busy.extend(str(root / job.window) for _, job in staged)
        return report
    for path, job in staged:
        try:
            place_job_window(root, job)
            if path.name.endswith(UNPLACED_SUFFIX):
                path.unlink(missing_ok=True)  # in place now: the worker's job files suffice
        except (OSError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}; its capture stays at {root / str(job.staged)}"
            report.failed.append((str(root / job.window), reason))
    return report


def summarise_spooled(record: WindowRecord) -> None:
    """Summarise a spooled window that was never summarised, from its own trace (the
    worker's :func:`~neuron_mlflow.engine.finish.summarise_window`)."""
    summarise_window(record)


def sync_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
) -> SyncReport:
    """Upload every pending window of the spool at ``local_dir`` exactly once; mark it done.
    Ended windows not yet in place are put in place first (:func:`place_ended_windows`).

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
    placed = place_ended_windows(local_dir)
    report = upload_pending(local_dir, tracking_uri, include_incomplete, summarise_spooled)
    report.busy.extend(placed.busy)
    report.failed.extend(placed.failed)
    return report
