"""Spool clean-up: an uploaded window's trace files leave the spool; its record stays.

What leaves and what never does (``keep_local``, ``local_max_bytes``, ``sync --prune``, the
windows a running process claims): docs/spool.md.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from neuron_mlflow.sinks.claims import claim, release
from neuron_mlflow.sinks.spool import MANIFEST, Spool, WindowRecord, remove_empty_tree

TRACES = "traces"
"""The folder under a window's ``artifacts/`` that holds the profiler's output."""


@dataclass
class PruneReport:
    """What a clean-up removed and what it kept.

    Attributes:
        pruned: window folders whose uploaded trace files were removed.
        freed_bytes: bytes those files took.
        kept: ``(window folder, reason)`` for windows whose traces stay.
    """

    pruned: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept: list[tuple[str, str]] = field(default_factory=list)


def uploaded_trace_files(record: WindowRecord) -> list[Path]:
    """The window's trace files that MLflow confirmed (absolute paths): when the window is
    ``done`` and its artifacts are marked uploaded, those in ``progress.artifact_files``."""
    if record.status != "done" or not record.window.uploaded.artifacts:
        return []
    confirmed = set(record.window.progress.artifact_files)
    files = sorted(p for p in (record.artifacts_dir / TRACES).rglob("*") if p.is_file())
    return [p for p in files if p.relative_to(record.artifacts_dir).as_posix() in confirmed]


def _why_kept(record: WindowRecord) -> str | None:
    if record.status != "done":
        return f"status {record.status}: not uploaded"
    if any(p.is_file() for p in (record.artifacts_dir / TRACES).rglob("*")):
        return "its traces were never uploaded (upload_traces off): the only copy"
    return None


def remove_uploaded_traces(record: WindowRecord) -> int:
    """Remove the window's confirmed trace files (and folders left empty); bytes freed."""
    freed = 0
    for path in uploaded_trace_files(record):
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        freed += size
    remove_empty_tree(record.artifacts_dir / TRACES)
    return freed


def spool_bytes(local_dir: Path) -> int:
    """Bytes of every file under the spool folder."""
    total = 0
    for folder, _dirs, files in os.walk(local_dir):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def enforce_cap(local_dir: Path, max_bytes: int, holding: Path | None = None) -> PruneReport:
    """Remove uploaded windows' trace files, oldest first, until the spool is ``max_bytes``
    or less (or no uploaded trace is left). ``holding``: a window this process already
    claims (cleaned without claiming again)."""
    report = PruneReport()
    total = spool_bytes(local_dir)
    done = Spool(local_dir).windows("done")
    for record in sorted(done, key=lambda r: (r.window.captured_ms, str(r.path))):
        if total <= max_bytes:
            break
        total -= _clean_claimed(record, holding, report)
    return report


def _clean_claimed(record: WindowRecord, holding: Path | None, report: PruneReport) -> int:
    """Claim the window (unless ``holding`` it), re-read its manifest and remove its uploaded
    traces; records the outcome in ``report``. Returns bytes freed."""
    held = None
    if holding is None or record.path.resolve() != holding.resolve():
        held = claim(record.path)
        if held is None:
            report.kept.append((str(record.path), "busy: a running process holds it"))
            return 0
    try:
        record.reload()
        if not uploaded_trace_files(record):
            reason = _why_kept(record)
            if reason is not None:
                report.kept.append((str(record.path), reason))
            return 0
        freed = remove_uploaded_traces(record)
    finally:
        release(held)
    report.pruned.append(str(record.path))
    report.freed_bytes += freed
    return freed


def cleanup_after_upload(window_dir: Path, keep_local: bool, local_max_bytes: int | None) -> None:
    """After MLflow confirmed a window's upload: remove its trace files (unless
    ``keep_local``), then hold the spool to ``local_max_bytes`` (``None``: no cap; the oldest
    uploaded first). For the process that holds the window's claim; a window not ``done``
    keeps everything, and a window or file that is gone is no error."""
    if not (window_dir / MANIFEST).is_file():
        return
    record = WindowRecord.load(window_dir)
    if record.status != "done":
        return
    if not keep_local:
        remove_uploaded_traces(record)
    session = record.window.session  # the spool's root: the parent of the session folder
    root = next((p.parent for p in window_dir.parents if p.name == session), None)
    if local_max_bytes is not None and root is not None:
        enforce_cap(root, local_max_bytes, holding=window_dir)


def prune(local_dir: str | os.PathLike[str], max_bytes: int | None = None) -> PruneReport:
    """Clean an existing spool: remove every uploaded window's trace files (``max_bytes``:
    only the oldest, until the spool fits). What was not uploaded stays, and each window
    left with trace files is listed in ``report.kept`` with the reason.

    Example:
        >>> import tempfile
        >>> report = prune(tempfile.mkdtemp())
        >>> report.pruned, report.kept
        ([], [])
    """
    root = Path(local_dir)
    if max_bytes is not None:
        return enforce_cap(root, max_bytes)
    report = PruneReport()
    for record in Spool(root).windows():
        if record.status == "done":
            _clean_claimed(record, None, report)
        elif (record.artifacts_dir / TRACES).is_dir():
            report.kept.append((str(record.path), _why_kept(record) or "not uploaded"))
    return report
