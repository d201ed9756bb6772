"""``sync``: upload the spool's pending windows, summarising first any that never were.

A live window is in the spool (record and trace, state ``spooled``) before the worker
process summarises it. When neither gets to it (a crash before the worker started, a worker
out of time), :func:`sync_pending` summarises the window from its trace with
the same engine and the same code as the worker (:func:`~neuron_mlflow.engine.finish.
summarise_window`), then uploads it: the same trace gives the same metrics either way.

Example:
    >>> import tempfile
    >>> sync_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

from neuron_mlflow.engine.finish import summarise_window
from neuron_mlflow.sinks.pending import SyncReport, upload_pending
from neuron_mlflow.sinks.spool import WindowRecord

__all__ = ["summarise_spooled", "sync_pending"]


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
