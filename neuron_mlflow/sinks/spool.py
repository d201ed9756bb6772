"""The local spool: every window is written here completely before any upload.

Layout under ``local_dir``::

    <session>/                             one per profiling session (time, host, pid, n)
      .capture/window_<n>/artifacts/traces/rank_<r>/
                                           the profiler writes here while a window runs;
                                           at its end the folder is renamed to:
      <P>/step_<first>-<last>/
        manifest.json                      status, target run, metrics, params, tags
        .lock                              the claim (:mod:`neuron_mlflow.sinks.claims`)
        artifacts/                         uploaded as MLflow artifacts under P/step_.../
          summary.md  summary.json  ops.csv  op_keys.json
          traces/rank_<r>/...              the profiler's output tree, as written

``manifest.json`` ``status`` is ``pending`` (not yet uploaded), ``done`` or ``incomplete``
(the window was interrupted by an exception; kept, not uploaded by default). ``uploaded``
records which parts reached MLflow and ``progress`` which metric chunks and artifact files
(see :mod:`neuron_mlflow.sinks.delivery`), so an upload cut short never logs a value twice.
``captured_ms`` is the capture time the metrics are logged with; ``job_id`` (when set) names
the job, so that every rank's windows of an offline job sync into one run.

Example:
    >>> import tempfile
    >>> spool = Spool(tempfile.mkdtemp())
    >>> record = spool.create_window(spool.new_session_dir(), "profile/step_000001-000003")
    >>> record.manifest["status"], (record.path / "artifacts").is_dir()
    ('pending', True)
    >>> [r.artifact_path for r in spool.windows("pending")]
    ['profile/step_000001-000003']
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from neuron_mlflow.sinks.claims import Claim, claim

Status = Literal["pending", "done", "incomplete"]
MANIFEST = "manifest.json"
ARTIFACTS = "artifacts"
CAPTURE = ".capture"
UPLOAD_PARTS = ("tags", "params", "metrics", "artifacts")

_session_counter = itertools.count(1)


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # One line, keys sorted: the C encoder (``indent`` would take the pure-Python one, about
    # ten times slower; the step that ends a window writes a manifest).
    tmp.write_text(json.dumps(data, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class WindowRecord:
    """One spooled window: its folder and its manifest.

    Example:
        >>> import tempfile
        >>> spool = Spool(tempfile.mkdtemp())
        >>> record = spool.create_window(spool.new_session_dir(), "p/step_000000-000000")
        >>> record.mark_uploaded("metrics"); record.manifest["uploaded"]["metrics"]
        True
    """

    path: Path
    manifest: dict[str, Any]
    claim: Claim | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Give up this process's claim on the window (:mod:`neuron_mlflow.sinks.claims`)."""
        claim, self.claim = self.claim, None
        if claim is not None:
            claim.release()

    @classmethod
    def load(cls, path: Path) -> WindowRecord:
        """The window spooled at ``path`` (its manifest read from disk)."""
        return cls(path=path, manifest=json.loads((path / MANIFEST).read_text(encoding="utf-8")))

    def reload(self) -> None:
        """Read the manifest again from disk (another process may have changed it)."""
        self.manifest = json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))

    @property
    def artifacts_dir(self) -> Path:
        """The folder uploaded as the window's artifacts."""
        return self.path / ARTIFACTS

    @property
    def artifact_path(self) -> str:
        """Where the artifacts go in the run: ``P/step_<first>-<last>``."""
        return str(self.manifest["artifact_path"])

    @property
    def status(self) -> Status:
        """``pending``, ``done`` or ``incomplete``."""
        return self.manifest["status"]

    def save(self) -> None:
        """Write the manifest (atomically)."""
        _write_json_atomic(self.path / MANIFEST, self.manifest)

    def update(self, **fields: Any) -> None:
        """Set manifest fields and save."""
        self.manifest.update(fields)
        self.save()

    def mark_uploaded(self, part: str) -> None:
        """Record that ``part`` (tags, params, metrics, artifacts) reached MLflow, and save."""
        self.manifest["uploaded"][part] = True
        self.save()

    def is_uploaded(self, part: str) -> bool:
        """Whether ``part`` already reached MLflow."""
        return bool(self.manifest["uploaded"].get(part))


class Spool:
    """The local spool rooted at ``root`` (``ProfilerConfig.local_dir``).

    Args:
        root: the spool folder; created when first written.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def new_session_dir(self) -> Path:
        """A fresh folder for one profiling session, unique across hosts and processes."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}_{socket.gethostname()}_pid{os.getpid()}_{next(_session_counter)}"
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def capture_dir(session_dir: Path, window_index: int) -> Path:
        """Staging folder where the profiler writes a running window's output."""
        path = session_dir / CAPTURE / f"window_{window_index}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create_window(
        self,
        session_dir: Path,
        artifact_path: str,
        status: Status = "pending",
        staged: Path | None = None,
        claimed: bool = False,
        **fields: Any,
    ) -> WindowRecord:
        """Create the folder and manifest of a window under ``session_dir``.

        Args:
            session_dir: from :meth:`new_session_dir`.
            artifact_path: ``P/step_<first>-<last>``; also the folder's path in the session.
            status: initial status.
            staged: a folder whose ``artifacts/`` (a capture's traces) the window takes over:
                renamed into place, nothing copied; the folder is gone afterwards.
            claimed: the record holds this process's claim on the window, taken before the
                window is visible (release it with :meth:`WindowRecord.release`).
            **fields: more manifest fields (metrics, params, tags, run_id, ...).
        """
        path = session_dir / artifact_path
        manifest: dict[str, Any] = {
            "format": 1,
            "status": status,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "captured_ms": int(time.time() * 1000),  # the metrics' timestamp
            "artifact_path": artifact_path,
            "session": session_dir.name,
            "run_id": None,
            "uploaded": dict.fromkeys(UPLOAD_PARTS, False),
            "error": None,
        }
        manifest.update(fields)
        takes_over = staged is not None and (staged / ARTIFACTS).is_dir()
        if staged is not None and takes_over and not path.exists():
            # The manifest goes in with the traces, then one rename puts both in place: a
            # crash leaves either the staged window (manifest and all) or the placed one.
            held = claim(staged) if claimed else None  # the claim moves with the folder
            try:
                WindowRecord(path=staged, manifest=manifest).save()
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, path)
            except BaseException:
                if held is not None:
                    held.release()
                raise
            return WindowRecord(path=path, manifest=manifest, claim=held)
        (path / ARTIFACTS).mkdir(parents=True, exist_ok=True)
        held = claim(path) if claimed else None
        if staged is not None:
            if takes_over:
                shutil.rmtree(path / ARTIFACTS)
                os.replace(staged / ARTIFACTS, path / ARTIFACTS)
            shutil.rmtree(staged, ignore_errors=True)
        record = WindowRecord(path=path, manifest=manifest, claim=held)
        try:
            record.save()
        except BaseException:
            record.release()
            raise
        return record

    def windows(self, *statuses: Status) -> Iterator[WindowRecord]:
        """Spooled windows, oldest first, optionally only those with the given statuses."""
        if not self.root.is_dir():
            return
        for manifest_path in sorted(self.root.rglob(MANIFEST)):
            try:
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not statuses or manifest.get("status") in statuses:
                yield WindowRecord(path=manifest_path.parent, manifest=manifest)


def write_summary_files(
    artifacts: Path, summary: Any, title: str, document: dict[str, Any]
) -> dict[str, str]:
    """Write a window's ``summary.md``, ``summary.json``, ``ops.csv``, ``op_keys.json`` and
    ``config.json`` (the window's effective config, ``document["config"]``, when given).

    Args:
        artifacts: the window's artifact folder.
        summary: its :class:`~neuron_mlflow.summary.ops.OpSummary`.
        title: the Markdown table's title.
        document: more top-level entries of ``summary.json`` (window, config, environment...).

    Returns:
        The op keys (op name to metric key).
    """
    from neuron_mlflow.naming import op_keys
    from neuron_mlflow.summary.tables import render_csv, render_markdown

    keys = op_keys(op.name for op in summary.ops)
    (artifacts / "summary.md").write_text(render_markdown(summary, title=title), encoding="utf-8")
    full = {**document, "summary": summary.to_dict()}
    (artifacts / "summary.json").write_text(
        json.dumps(full, indent=2, default=str), encoding="utf-8"
    )
    (artifacts / "ops.csv").write_text(render_csv(summary, keys), encoding="utf-8")
    if document.get("config") is not None:
        (artifacts / "config.json").write_text(
            json.dumps(document["config"], indent=2, sort_keys=True, default=str),
            encoding="utf-8",
        )
    (artifacts / "op_keys.json").write_text(
        json.dumps({key: name for name, key in keys.items()}, indent=2, sort_keys=True),
        encoding="utf-8",
    )
    return keys
