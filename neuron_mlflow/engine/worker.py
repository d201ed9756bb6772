"""The background uploader: one thread per process that finishes windows off the training thread.

The training thread only stops the profiler, spools the window (manifest and traces) and
submits the rest (summary, then the upload: metrics, params once per prefix and run and tags,
then artifacts, each chunk marked in the manifest when the server confirmed it) here. Jobs
run one at a time in submission order from a bounded queue. At the end of a session
(``close()``, the callback's ``teardown``) and at process exit (``atexit``) the worker drains
for at most ``upload_timeout_s``; what is left stays in the spool, with one warning that names
the folder and the ``neuron-mlflow sync`` command.

Example:
    >>> worker = Worker()
    >>> future = worker.submit(sum, [1, 2, 3])
    >>> future.result(timeout=5)
    6
    >>> worker.drain(timeout_s=5)
    True
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from neuron_mlflow.errors import NeuronMlflowWarning

T = TypeVar("T")

log = logging.getLogger("neuron_mlflow")

_Job = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any]", str | None]

QUEUE_SIZE = 64
"""Windows that may wait for the worker; a full queue runs the job on the caller's thread."""


class Worker:
    """A single daemon thread running submitted jobs in order, with a bounded queue.

    Args:
        name: the thread's name.
        queue_size: how many jobs may wait.
    """

    def __init__(self, name: str = "neuron-mlflow-worker", queue_size: int = QUEUE_SIZE) -> None:
        self._queue: queue.Queue[_Job] = queue.Queue(queue_size)
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._folders: Counter[str] = Counter()
        self._timeout_s: float | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        folder: str | None = None,
        timeout_s: float | None = None,
    ) -> Future[T]:
        """Run ``fn(*args)`` on the worker thread; its result or exception lands in the future.

        Args:
            fn, args: the job.
            folder: the spool folder the job works on (named in the warning when it is left
                over at the end).
            timeout_s: the job's session's ``upload_timeout_s`` (the drain at exit waits for
                the largest).

        When the queue is full the job runs at once on the calling thread (nothing is lost).
        """
        future: Future[T] = Future()
        with self._lock:
            self._pending += 1
            if folder is not None:
                self._folders[folder] += 1
            if timeout_s is not None:
                self._timeout_s = max(self._timeout_s or 0.0, timeout_s)
            self._ensure_thread()
        try:
            self._queue.put_nowait((fn, args, future, folder))
        except queue.Full:
            log.warning("neuron-mlflow: the background queue is full; finishing a window inline")
            self._execute(fn, args, future, folder)
        return future

    def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any], folder: str | None
    ) -> None:
        try:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            with self._lock:
                self._pending -= 1
                if folder is not None:
                    self._folders[folder] -= 1
                    if self._folders[folder] <= 0:
                        del self._folders[folder]
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            fn, args, future, folder = self._queue.get()
            self._execute(fn, args, future, folder)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted job has finished, at most ``timeout_s`` seconds.

        Returns:
            True when nothing is left.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    @property
    def timeout_s(self) -> float:
        """How long the drain at exit waits: the largest ``upload_timeout_s`` submitted."""
        return DRAIN_AT_EXIT_S if self._timeout_s is None else self._timeout_s

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._pending

    def folders(self) -> list[str]:
        """The spool folders of the jobs not yet finished."""
        with self._lock:
            return sorted(self._folders)

    def drain_or_warn(self, timeout_s: float, folders: list[str] | None = None) -> bool:
        """:meth:`drain`; when jobs are left, one warning (and log record) naming the spool
        folder(s) and the ``neuron-mlflow sync`` command. Never raises.

        Args:
            timeout_s: the longest wait (``upload_timeout_s``).
            folders: the folders to name (default: those of the jobs left).
        """
        if self.drain(timeout_s):
            return True
        left = folders or self.folders() or ["the spool folder (local_dir)"]
        commands = "; ".join(f"`neuron-mlflow sync --local-dir {f}`" for f in left)
        message = (
            f"neuron-mlflow: {self.pending} profiling window(s) were not uploaded within "
            f"{timeout_s:g} s (upload_timeout_s); they stay in {', '.join(left)}. "
            f"Run {commands} to upload them"
        )
        log.warning(message)
        with contextlib.suppress(Warning):  # `-W error`: the log record above is the report
            warnings.warn(message, NeuronMlflowWarning, stacklevel=3)
        return False


_worker: Worker | None = None
_worker_lock = threading.Lock()
DRAIN_AT_EXIT_S = 60.0
"""The drain at exit when no job named its ``upload_timeout_s`` (the config's default)."""


def worker() -> Worker:
    """The process's worker (created on first use).

    Example:
        >>> worker() is worker()
        True
    """
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = Worker()
        return _worker


@atexit.register
def _drain_at_exit() -> None:
    if _worker is not None and _worker.pending:
        _worker.drain_or_warn(_worker.timeout_s)
