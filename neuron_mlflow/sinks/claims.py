"""Claims on spooled windows: one process at a time finishes or uploads a window.

A claim is an exclusive ``flock`` on the window's ``.lock`` file, dropped by the operating
system when its process ends; without ``fcntl`` (Windows) or ``flock`` claims always succeed.
Who claims a window when: docs/spool.md.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> first = claim(folder)
    >>> first is not None, claim(folder) is None  # held: a second claim is refused
    (True, True)
    >>> first.release(); again = claim(folder); again is not None
    True
    >>> again.release()
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOCK = ".lock"
"""The lock file in a window's folder (never uploaded: it is outside ``artifacts/``)."""
QUEUE = ".queue"
"""The worker's queue under the spool root: one job file per window, its record (a job of
schema 2 names its folder as ``window``)."""
WORKER_LOCK = ".worker.lock"
"""Held by the spool's worker process while it runs."""

_held: set[int] = set()
"""This process's claim descriptors: a forked child (a DataLoader worker) closes its copies,
so that it never keeps a window claimed after the parent released it."""


@dataclass
class Claim:
    """A held claim on one window folder; :meth:`release` gives it up (idempotent)."""

    fd: int | None

    def __del__(self) -> None:  # a claim dropped unreleased is released, never leaked
        with contextlib.suppress(Exception):  # (at interpreter exit the OS does it)
            self.release()

    def release(self) -> None:
        """Give the claim up."""
        fd, self.fd = self.fd, None
        if fd is not None and fd in _held:
            _held.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)


def release(held: Claim | None) -> None:
    """Give ``held`` up, when there is one."""
    if held is not None:
        held.release()


def claim(folder: Path) -> Claim | None:
    """Claim the window at ``folder`` without waiting; ``None`` when another process holds it."""
    return claim_file(folder / LOCK)


def claim_file(path: Path) -> Claim | None:
    """:func:`claim` of the lock file ``path`` (created)."""
    fd = _lock(path, create=True)
    if fd is None:
        return None
    if fd < 0:  # nothing to lock with: no claims
        return Claim(None)
    _held.add(fd)
    return Claim(fd)


def _lock(path: Path, create: bool) -> int | None:
    """An exclusive ``flock`` on the file ``path``, without waiting: the descriptor, ``-1``
    (no ``fcntl``, a filesystem without ``flock``, or, unless ``create``, no file), or
    ``None`` when another process holds it."""
    try:
        import fcntl
    except ImportError:
        return -1
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            if create:
                raise
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            return -1  # ENOSYS, ENOLCK...
        if os.fstat(fd).st_nlink:
            return fd
        # removed between our open and our lock (a worker cleaning up after a dead client
        # found it free): a lock on it would be seen by nobody
        os.close(fd)
    return None if create else -1


def worker_running(root: Path) -> bool:
    """True while a worker process serves the spool at ``root`` (it holds the worker lock).

    Example:
        >>> import tempfile
        >>> worker_running(Path(tempfile.mkdtemp()))
        False
    """
    fd = _lock(root / WORKER_LOCK, create=False)  # a probe never leaves a file behind
    if fd is None:
        return True
    if fd >= 0:
        os.close(fd)
    return False


def remove_if_free(path: Path) -> bool:
    """Remove the lock file ``path`` unless another process holds it; True when it is gone.
    It is removed under our lock: a process that opened it meanwhile sees it removed once it
    has the lock, and takes a new one (:func:`_lock`).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "x.lock"
        >>> held = claim_file(path)
        >>> remove_if_free(path), path.exists()  # held (the flock is per open file)
        (False, True)
        >>> held.release(); remove_if_free(path), path.exists()
        (True, False)
    """
    fd = _lock(path, create=False)
    if fd is None:
        return False
    try:
        path.unlink(missing_ok=True)
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    return True


def queued_jobs(root: Path) -> list[Path]:
    """The job files queued for the worker of the spool at ``root``, oldest first."""
    queue = root / QUEUE
    return sorted(queue.glob("*.json")) if queue.is_dir() else []


def queued_for_worker(root: Path) -> set[Path]:
    """The window folders queued for a running worker process (``sync`` leaves them to it);
    empty when no worker runs."""
    jobs = queued_jobs(root)
    if not jobs or not worker_running(root):
        return set()
    found = set()
    for path in jobs:
        try:
            job = json.loads(path.read_text(encoding="utf-8"))
            place = job["window"] if "window" in job else f"{job['session']}/{job['artifact_path']}"
            found.add((root / place).absolute())
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _close_in_child() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
