"""Uploading what the spool holds: the upload half of ``neuron-mlflow sync``.

:func:`upload_pending` groups the pending windows by job (else original run, else session),
has the sink choose each group's run and hands every window to the engine's pipeline. It
claims each window first: one that a running job (or another ``sync``) still holds is left to
it and reported in ``busy``, so two processes never send the same window.

Example:
    >>> import tempfile
    >>> upload_pending(tempfile.mkdtemp()).uploaded
    []
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from neuron_mlflow.sinks import reachability
from neuron_mlflow.sinks.claims import claim, queued_for_worker
from neuron_mlflow.sinks.mlflow_sink import MlflowSink, group_key
from neuron_mlflow.sinks.spool import Spool, WindowRecord

__all__ = ["Finish", "SyncReport", "upload_pending"]

Finish = Callable[[WindowRecord, MlflowSink, str], object]
"""The pipeline that finishes one claimed window into a run (the engine's
:func:`~neuron_mlflow.engine.pipeline.finish_window`); it raises when the window failed."""


def _upload_only(record: WindowRecord, sink: MlflowSink, run_id: str) -> None:
    """Without the engine's pipeline: upload a summarised window, refuse any other."""
    if not record.window.summarised:
        raise RuntimeError("the window was never summarised; `neuron-mlflow sync` summarises it")
    sink.upload(record, run_id)


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


def upload_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
    finish: Finish | None = None,
) -> SyncReport:
    """The upload half of :func:`neuron_mlflow.engine.sync.sync_pending` (same arguments),
    which passes the engine's pipeline as ``finish`` (:data:`Finish`). Without it a window
    never summarised is reported in ``failed`` and stays pending: never uploaded without its
    metrics.

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

    for group in groups.values():
        records = _claim([r for r in group if not busy(r)], report)
        report.busy.extend(str(r.path) for r in group if busy(r))
        try:
            if records:
                _upload_group(sink, records, report, finish or _upload_only)
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
    sink: MlflowSink, records: list[WindowRecord], report: SyncReport, finish: Finish
) -> None:
    try:
        run_id = sink.run_for(records, verify=True)
    except Exception as exc:
        report.failed.extend((str(r.path), f"{type(exc).__name__}: {exc}") for r in records)
        return
    for record in records:
        try:
            finish(record, sink, run_id)
            report.uploaded.append((str(record.path), run_id))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if record.window.error is None:
                record.update(error=reason)
            report.failed.append((str(record.path), reason))
