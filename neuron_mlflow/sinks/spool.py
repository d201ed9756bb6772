"""The local spool: every window is written here completely before any upload.

Its layout under ``local_dir`` is drawn in docs/spool.md: a window's capture is staged under
``<session>/.capture/window_<n>/``, then put in place with its record as
``<session>/<P>/step_<first>-<last>/manifest.json`` (:meth:`Spool.place`).

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
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from neuron_mlflow.sinks.claims import Claim, claim, release
from neuron_mlflow.sinks.window_record import (
    Status,
    Window,
    WindowState,
    decode_window,
    encode_window,
    state_from_status,
    window_view,
)

MANIFEST = "manifest.json"
ARTIFACTS = "artifacts"
CAPTURE = ".capture"

_session_counter = itertools.count(1)
_made_counter = itertools.count(1)
_NULLABLE = {"run_id", "error"}


@dataclass
class WindowRecord:
    """One spooled window: its folder and its record (:class:`Window`, the manifest).

    Each state change is one method that writes the record atomically.

    Example:
        >>> import tempfile
        >>> spool = Spool(tempfile.mkdtemp())
        >>> record = spool.create_window(spool.new_session_dir(), "p/step_000000-000000")
        >>> record.mark_uploaded("metrics"); record.window.uploaded.metrics
        True
        >>> record.summarised({"p/steps": 1.0}); record.window.state.value
        'summarised'
    """

    path: Path
    window: Window
    claim: Claim | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, path: Path) -> WindowRecord:
        """The window spooled at ``path``, read through :class:`Window`.

        Raises:
            OSError: no manifest there.
            ValueError: the manifest does not validate (the message names the file).
        """
        manifest = path / MANIFEST
        return cls(path=path, window=decode_window(manifest.read_bytes(), str(manifest)))

    def release(self) -> None:
        """Give up this process's claim on the window (:mod:`neuron_mlflow.sinks.claims`)."""
        release(self.claim)
        self.claim = None

    def reload(self) -> None:
        """Read the record again from disk (another process may have changed it)."""
        self.window = self.load(self.path).window

    @property
    def manifest(self) -> dict[str, Any]:
        """A read-only snapshot of the record as plain JSON data (:func:`window_view`)."""
        return window_view(self.window)

    @property
    def artifacts_dir(self) -> Path:
        """The folder uploaded as the window's artifacts."""
        return self.path / ARTIFACTS

    @property
    def artifact_path(self) -> str:
        """Where the artifacts go in the run: ``P/step_<first>-<last>``."""
        return self.window.artifact_path

    @property
    def status(self) -> Status:
        """``pending``, ``done`` or ``incomplete``."""
        return self.window.status

    def save(self) -> None:
        """Write the record (atomically: a temporary file renamed over the manifest)."""
        tmp = self.path / f".{MANIFEST}.{os.getpid()}.tmp"  # one per process
        tmp.write_bytes(encode_window(self.window))
        os.replace(tmp, self.path / MANIFEST)

    def update(self, **fields: Any) -> None:
        """Set fields of the record and save.

        Raises:
            AttributeError: a field :class:`Window` does not have.
        """
        for name, value in fields.items():
            if not hasattr(self.window, name):
                raise AttributeError(f"a window record has no field {name!r}")
            setattr(self.window, name, value)
        self.save()

    def summarised(self, metrics: dict[str, float], incomplete: bool = False) -> None:
        """``spooled``/``failed`` -> ``summarised`` (or ``incomplete``) with its metrics."""
        self.window.metrics = metrics
        self.window.state = WindowState.INCOMPLETE if incomplete else WindowState.SUMMARISED
        if self.window.failed_step == "summary":
            self.window.error = self.window.failed_step = None
        self.save()

    def failed(self, reason: str) -> None:
        """Summarising failed: ``failed`` with the reason (its traces stay; ``sync`` retries)."""
        if self.window.state is not WindowState.INCOMPLETE:
            self.window.state = WindowState.FAILED
        self.window.error, self.window.failed_step = reason, "summary"
        self.save()

    def upload_failed(self, reason: str) -> None:
        """The upload failed: the window stays pending for ``sync``, with the reason."""
        self.window.error, self.window.failed_step = reason, "upload"
        self.save()

    def uploaded(self) -> None:
        """MLflow confirmed every part: ``uploaded``."""
        self.window.state = WindowState.UPLOADED
        self.window.error = self.window.failed_step = None
        self.save()

    def handled(self) -> None:
        """The worker process is done with the window (whatever the outcome)."""
        self.window.handled = True
        self.save()

    def mark_uploaded(self, part: str) -> None:
        """Record that ``part`` (tags, params, metrics, artifacts) reached MLflow, and save."""
        setattr(self.window.uploaded, part, True)
        self.save()


class Spool:
    """The local spool rooted at ``root`` (``ProfilerConfig.local_dir``).

    Args:
        root: the spool folder; created when first written.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.invalid: list[tuple[Path, str]] = []
        """Manifests the last :meth:`windows` listing could not read, with the reason."""

    def new_session_dir(self) -> Path:
        """A fresh folder for one profiling session, unique across hosts and processes."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}_{socket.gethostname()}_pid{os.getpid()}_{next(_session_counter)}"
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def capture_dir(session_dir: Path, window_index: int, prefix: str | None = None) -> Path:
        """Staging folder where the profiler writes a running window's output.

        Given the window's ``prefix``, the folder its window lands in is made here too, when
        the window opens (so that putting it in place is one rename).
        """
        path = session_dir / CAPTURE / f"window_{window_index}"
        for attempt in range(3):
            try:
                path.mkdir(parents=True, exist_ok=True)
                break
            except FileNotFoundError:  # `.capture` removed meanwhile: its last window was
                if attempt == 2:  # put in place (:meth:`place`) between our two mkdirs
                    raise
        if prefix is not None:
            (session_dir / prefix).mkdir(parents=True, exist_ok=True)
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
        """A window record made from plain fields and put in place (:meth:`place`): for a
        window that no session captured (``ingest``, tests).

        Args:
            session_dir: from :meth:`new_session_dir`.
            artifact_path: ``P/step_<first>-<last>``; also the folder's path in the session.
            staged: a folder whose ``artifacts/`` (a capture's traces) the window takes over.
            claimed: the record holds this process's claim (see :meth:`place`).
            **fields: more fields of the :class:`Window` record (metrics, params, tags,
                run_id, ...; ``window`` is read as ``facts``); ``summarised=False`` makes a
                ``spooled`` window (``summarised`` by default, as given).
        """
        data: dict[str, Any] = {
            "state": state_from_status(status, fields.pop("summarised", True)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "captured_ms": int(time.time() * 1000),  # the metrics' timestamp
            "artifact_path": artifact_path,
            "session": session_dir.name,
        }
        if "window" in fields:
            fields["facts"] = fields.pop("window")
        data.update({k: v for k, v in fields.items() if v is not None or k in _NULLABLE})
        window = msgspec.convert(data, Window)
        if staged is None:
            staged = session_dir / CAPTURE / f"made_{os.getpid()}_{next(_made_counter)}"
        (staged / ARTIFACTS).mkdir(parents=True, exist_ok=True)
        return Spool(session_dir.parent).place(window, staged, claimed)

    def staged_dir(self, window: Window) -> Path:
        """Where a live window's capture is until it is put in place:
        ``<session>/.capture/window_<index>/`` (made by :meth:`capture_dir` when it opened)."""
        index = window.facts.index if window.facts is not None else 0
        return self.root / window.session / CAPTURE / f"window_{index}"

    def place(
        self, window: Window, staged: Path | None = None, claimed: bool = False
    ) -> WindowRecord:
        """Put a window in place: the one way a window enters the spool.

        The complete record is saved beside the capture (``staged``, default
        :meth:`staged_dir`: its ``artifacts/`` hold the traces), then one rename makes both
        visible at ``<session>/<artifact_path>``: a crash leaves either the staged window
        (its record still queued) or the placed one. A window already in place is read as it
        is (placed before, by another process or an earlier try). When another window holds
        the place (the same steps captured again), the new one takes over its artifacts.

        Args:
            window: the complete record.
            staged: the folder whose ``artifacts/`` the window takes (moved, not copied).
            claimed: the record holds this process's claim, taken before the window is
                visible (release it with :meth:`WindowRecord.release`).

        Raises:
            OSError: the window is neither staged nor in place.
        """
        path = self.root / window.session / window.artifact_path
        staged = self.staged_dir(window) if staged is None else staged
        if not staged.is_dir():
            return WindowRecord.load(path)  # in place already
        held = claim(staged) if claimed else None  # the claim moves with the folder
        try:
            WindowRecord(path=staged, window=window).save()
            try:
                os.rename(staged, path)
            except FileNotFoundError:
                if not staged.is_dir():  # another process placed it meanwhile
                    release(held)
                    return WindowRecord.load(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged, path)
        except BaseException as exc:
            release(held)
            if isinstance(exc, OSError) and staged.is_dir():  # another window holds the place
                return _take_over(path, window, staged, claimed)
            raise
        _remove_if_empty(staged.parent)
        return WindowRecord(path=path, window=window, claim=held)

    def windows(self, *statuses: Status) -> Iterator[WindowRecord]:
        """Spooled windows, oldest first, optionally only those with the given statuses.

        A manifest that cannot be read or does not validate is skipped here and listed in
        :attr:`invalid` (file and reason; nothing is deleted).
        """
        self.invalid = []
        if not self.root.is_dir():
            return
        # os.walk, not rglob: a folder removed while it is listed (an uploaded window's
        # traces, cleaned up by the worker) is passed over, not an error
        found = (Path(d) / MANIFEST for d, _, files in os.walk(self.root) if MANIFEST in files)
        for manifest_path in sorted(found):
            try:
                record = WindowRecord.load(manifest_path.parent)
            except OSError:
                continue  # renamed or removed since the listing
            except ValueError as exc:
                self.invalid.append((manifest_path, str(exc)))
                continue
            if not statuses or record.status in statuses:
                yield record


def rmdir_if_empty(folder: Path) -> bool:
    """Remove ``folder`` if it is an empty folder; True when removed."""
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def remove_empty_tree(root: Path) -> bool:
    """Remove the empty folders below ``root`` (deepest first), then ``root`` if it is empty
    by then; a file, and every folder holding one, stays. True when ``root`` went."""
    for folder in sorted(root.rglob("*"), reverse=True):
        rmdir_if_empty(folder)
    return rmdir_if_empty(root)


def _remove_if_empty(staging: Path) -> None:
    """The session's ``.capture/`` once its last staged window was put in place (a window
    staged since keeps it; :meth:`Spool.capture_dir` makes it again for the next one)."""
    if staging.name == CAPTURE:
        rmdir_if_empty(staging)


def _take_over(path: Path, window: Window, staged: Path, claimed: bool) -> WindowRecord:
    """Another window holds ``path`` (the same steps captured again): ``staged``'s
    artifacts replace its own, and the record is saved last."""
    (path / ARTIFACTS).mkdir(parents=True, exist_ok=True)
    held = claim(path) if claimed else None
    if (staged / ARTIFACTS).is_dir():
        shutil.rmtree(path / ARTIFACTS)
        os.replace(staged / ARTIFACTS, path / ARTIFACTS)
    shutil.rmtree(staged, ignore_errors=True)
    _remove_if_empty(staged.parent)
    record = WindowRecord(path=path, window=window, claim=held)
    try:
        record.save()
    except BaseException:
        record.release()
        raise
    return record
