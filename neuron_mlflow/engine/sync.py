"""``sync``: finish the spool's windows that no worker process finished, with the worker's
pipeline (docs/spool.md).

Example:
    >>> import tempfile
    >>> sync_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from neuron_mlflow.engine.pipeline import finish_window
from neuron_mlflow.engine.worker import (
    CAPTURING,
    CLIENTS,
    drop_job,
    held_locks,
    queued_place,
    read_jobs,
)
from neuron_mlflow.sinks.claims import worker_running
from neuron_mlflow.sinks.pending import SyncReport, upload_pending
from neuron_mlflow.sinks.spool import CAPTURE, Spool, WindowRecord, remove_empty_tree
from neuron_mlflow.sinks.window_record import Window

__all__ = ["drop_finished_jobs", "place_queued", "remove_abandoned_captures", "sync_pending"]


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
    spool, report = Spool(root), SyncReport()
    jobs = read_jobs(root)
    running = bool(jobs) and worker_running(root)
    for path, window in jobs:
        if isinstance(window, Exception):
            if path.exists():
                report.failed.append((str(path), f"{type(window).__name__}: {window}"))
        elif not spool.staged_dir(window).is_dir():
            continue  # in place already
        elif running:
            report.busy.append(str(queued_place(root, window)))
        else:
            try:
                spool.place(window)
            except OSError as exc:
                where = spool.staged_dir(window)
                reason = f"{type(exc).__name__}: {exc}; its capture stays at {where}"
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
    stays in the spool, traces and all.

    Args:
        local_dir: the spool folder (``ProfilerConfig.local_dir``).
        tracking_uri: target server; ``None`` means what MLflow resolves now.
        include_incomplete: also upload windows interrupted by an exception.

    Returns:
        A :class:`~neuron_mlflow.sinks.pending.SyncReport`.

    Raises:
        ConnectionError: the tracking server is not reachable (nothing was uploaded).
    """
    root = Path(local_dir)
    for folder in (CLIENTS, CAPTURING):  # dead processes' lock files leave, as the worker's
        held_locks(root / folder)
    placed = place_queued(local_dir)
    remove_abandoned_captures(root)
    try:
        report = upload_pending(local_dir, tracking_uri, include_incomplete, finish_window)
    finally:
        drop_finished_jobs(root)
    report.busy.extend(placed.busy)
    report.failed.extend(placed.failed)
    return report


def drop_finished_jobs(local_dir: str | Path) -> list[Path]:
    """Drop the queued jobs whose window is in place and uploaded, unless a worker runs (it
    drops its own). Returns the job files dropped.

    Example:
        >>> import tempfile
        >>> drop_finished_jobs(tempfile.mkdtemp())
        []
    """
    root = Path(local_dir)
    jobs = read_jobs(root)
    if not jobs or worker_running(root):
        return []
    spool, dropped = Spool(root), []
    for path, window in jobs:
        if isinstance(window, Exception) or spool.staged_dir(window).is_dir():
            continue  # unreadable, or not in place
        try:
            done = WindowRecord.load(queued_place(root, window)).status == "done"
        except (OSError, ValueError):
            continue
        if done:
            drop_job(path)
            dropped.append(path)
    return dropped


_SESSION = re.compile(r"\d{8}T\d{6}Z_(?P<host>.+)_pid(?P<pid>\d+)_\d+")
"""A session folder's name (:meth:`~neuron_mlflow.sinks.spool.Spool.new_session_dir`)."""


def _process_gone(session: str) -> bool:
    """True when the session's process ran on this host and has ended (False when unsure)."""
    match = _SESSION.fullmatch(session)
    if match is not None and match["host"] == socket.gethostname():
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
    return False


def remove_abandoned_captures(local_dir: str | Path) -> list[Path]:
    """Remove the empty staging folders of processes killed mid-window, on the conditions
    docs/spool.md lists. Returns the staging folders removed.

    Example:
        >>> import tempfile
        >>> remove_abandoned_captures(tempfile.mkdtemp())
        []
    """
    root = Path(local_dir)
    candidates = sorted(root.glob(f"*/{CAPTURE}/*/"))
    if not candidates or held_locks(root / CAPTURING):
        return []
    queued = {window.session for _, window in read_jobs(root) if isinstance(window, Window)}
    removed = []
    for staging in candidates:
        session = staging.parent.parent
        if session.name in queued or not _process_gone(session.name):
            continue
        if any(not p.is_dir() for p in staging.rglob("*")):
            continue  # a file: not ours to judge
        if remove_empty_tree(staging):
            removed.append(staging)
        remove_empty_tree(session)  # .capture/, the window's empty P/ folder made when it opened
    return removed
