"""Uploading what the spool holds: the upload half of ``neuron-mlflow sync``.

:func:`upload_pending` groups the pending windows by job (else original run, else session),
finds or creates each group's run and uploads every window exactly once
(:meth:`~neuron_mlflow.sinks.mlflow_sink.MlflowSink.upload`). It claims each window first
(:mod:`neuron_mlflow.sinks.claims`): a window that a running job (or another ``sync``) still
holds is left to it and reported in ``busy``, so two processes never send the same window.

Example:
    >>> import tempfile
    >>> upload_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from neuron_mlflow.sinks import reachability
from neuron_mlflow.sinks.claims import claim, queued_for_worker
from neuron_mlflow.sinks.mlflow_sink import MlflowSink
from neuron_mlflow.sinks.spool import Spool, WindowRecord

__all__ = ["SyncReport", "group_key", "target_run", "upload_pending"]


def _summarise(record: WindowRecord, summarise: Callable[[WindowRecord], object] | None) -> None:
    """Summarise a never-summarised window in place, or say why it cannot be uploaded."""
    if summarise is None:
        raise RuntimeError("the window was never summarised; `neuron-mlflow sync` summarises it")
    try:
        summarise(record)
    except Exception as exc:
        raise RuntimeError(
            f"summarising the window from its trace failed ({type(exc).__name__}: {exc}); "
            f"its traces stay at {record.artifacts_dir}"
        ) from exc


@dataclass
class SyncReport:
    """What :func:`upload_pending` (``neuron-mlflow sync``) did.

    Attributes:
        uploaded: windows uploaded now, as ``(window folder, run id)``.
        failed: windows that could not be uploaded, as ``(window folder, error)``.
        skipped: incomplete windows left alone (pass ``include_incomplete``).
        busy: windows a running job (or another ``sync``) is still finishing, left to it.
    """

    uploaded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)


def group_key(record: WindowRecord) -> str:
    """Windows of one group go into one run: the job, else the original run, else the session."""
    window = record.window
    if window.job_id:
        return f"job:{window.job_id}"
    if window.run_id:
        return f"run:{window.run_id}"
    return f"session:{window.session}"


def target_run(sink: MlflowSink, key: str, records: list[WindowRecord]) -> str:
    """The run a group of windows goes into: the original run if it exists, else the job's.

    A group without a job id gets one derived from its ``key`` (:func:`group_key`), written into
    every manifest before the run is created, so a later sync (after a crash, or for windows
    a running job still held) finds the same run.
    """
    first = records[0].window
    original = next((r.window.run_id for r in records if r.window.run_id), None)
    if original and sink.run_exists(original):
        return str(original)
    job_id = first.job_id
    if not job_id:
        # from the group (its original run, else its session): the windows a running job
        # still held this time find the same run at a later sync
        job_id = f"sync-{uuid.uuid5(uuid.NAMESPACE_URL, key).hex}"
        for record in records:
            record.update(job_id=job_id)
    owners = [r for r in records if not r.window.traces_only] or records
    tags: dict[str, str] = dict(owners[0].window.tags)
    run_id = sink.job_run(
        str(job_id), first.experiment_name, first.run_name, tags=tags,
        experiment_id=first.experiment_id,
    )  # fmt: skip
    for record in records:
        if record.window.run_id not in (None, run_id):
            record.update(original_run_id=record.window.run_id)
    return run_id


def upload_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
    summarise: Callable[[WindowRecord], object] | None = None,
) -> SyncReport:
    """Upload every pending window of the spool at ``local_dir`` exactly once; mark it done.

    ``neuron-mlflow sync`` is :func:`neuron_mlflow.engine.sync.sync_pending`, which passes
    the engine's ``summarise``: a window spooled but never summarised (``"summarised":
    false``) is summarised by it before the upload. Without it, or when it raises, such a
    window is reported in ``failed`` and stays pending: it is never uploaded without its
    metrics.

    Each window goes into its original run when that run exists on the tracking server, else
    into the run of its job (every rank of an offline job shares one job id, decided by rank
    0), created once and found again by its tag
    :data:`~neuron_mlflow.naming.JOB_TAG`. Windows already done are never
    uploaded again; a window cut short by a crash is resumed chunk by chunk.

    Args:
        local_dir: the spool folder (``ProfilerConfig.local_dir``).
        tracking_uri: target server; ``None`` means what MLflow resolves now.
        include_incomplete: also upload windows interrupted by an exception.
        summarise: summarises a window in place (metrics into its manifest).

    Returns:
        A :class:`SyncReport`.

    Raises:
        ConnectionError: the tracking server is not reachable (nothing was uploaded).
    """
    spool = Spool(local_dir)
    report = SyncReport()
    groups: dict[str, list[WindowRecord]] = {}
    for record in spool.windows("pending", "incomplete"):  # one pass over the manifests
        if record.status == "pending" or include_incomplete:
            groups.setdefault(group_key(record), []).append(record)
        else:
            report.skipped.append(str(record.path))
    report.failed.extend((str(path.parent), reason) for path, reason in spool.invalid)
    if not groups:
        return report
    sink = MlflowSink(tracking_uri)
    reachability.check_reachable(sink.tracking_uri, cached=False)
    queued = queued_for_worker(spool.root)

    def busy(record: WindowRecord) -> bool:  # the worker has it (and is not done with it)
        return record.path.absolute() in queued and not record.window.handled

    for key, group in groups.items():
        records = _claim([r for r in group if not busy(r)], report)
        report.busy.extend(str(r.path) for r in group if busy(r))
        try:
            if records:
                _upload_group(sink, key, records, report, summarise)
        finally:
            for record in records:
                record.release()
    return report


def _claim(records: list[WindowRecord], report: SyncReport) -> list[WindowRecord]:
    """The group's windows this process now holds, each manifest read again under the claim;
    the ones held elsewhere go to ``report.busy``, the ones finished meanwhile are dropped."""
    held = []
    for record in records:
        try:
            record.claim = claim(record.path)
            if record.claim is None:
                report.busy.append(str(record.path))
                continue
            record.reload()
        except OSError:  # gone since the listing (renamed into place, or deleted)
            record.release()
            continue
        if record.status in ("pending", "incomplete"):
            held.append(record)
        else:
            record.release()
    return held


def _upload_group(
    sink: MlflowSink,
    key: str,
    records: list[WindowRecord],
    report: SyncReport,
    summarise: Callable[[WindowRecord], object] | None,
) -> None:
    try:
        run_id = target_run(sink, key, records)
    except Exception as exc:
        for record in records:
            report.failed.append((str(record.path), f"{type(exc).__name__}: {exc}"))
        return
    for record in records:
        try:
            if not record.window.summarised:
                _summarise(record, summarise)
            sink.upload(record, run_id)
            report.uploaded.append((str(record.path), run_id))
        except Exception as exc:
            record.update(error=f"{type(exc).__name__}: {exc}")
            report.failed.append((str(record.path), f"{type(exc).__name__}: {exc}"))
