"""The background worker: one thread per process that finishes windows off the training thread.

The training thread only stops the profiler, lets the backend write its trace into the
spool's staging folder, and submits the rest of the window (summarising, assembling the
window folder, uploading) here. Jobs run one at a time in submission order. At exit
(``atexit``) the worker drains for a bounded time; what is left stays in the spool.

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
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("neuron_mlflow")

QUEUE_SIZE = 64
"""Windows that may wait for the worker; a full queue runs the job on the caller's thread."""


class Worker:
    """A single daemon thread running submitted jobs in order, with a bounded queue.

    Args:
        name: the thread's name.
        queue_size: how many jobs may wait.
    """

    def __init__(self, name: str = "neuron-mlflow-worker", queue_size: int = QUEUE_SIZE) -> None:
        self._queue: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = (
            queue.Queue(queue_size)
        )
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the worker thread; its result or exception lands in the future.

        When the queue is full the job runs at once on the calling thread (nothing is lost).
        """
        future: Future[T] = Future()
        with self._lock:
            self._pending += 1
            self._ensure_thread()
        try:
            self._queue.put_nowait((fn, args, future))
        except queue.Full:
            log.warning("neuron-mlflow: the background queue is full; finishing a window inline")
            self._execute(fn, args, future)
        return future

    def _execute(self, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any]) -> None:
        try:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            with self._lock:
                self._pending -= 1
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            fn, args, future = self._queue.get()
            self._execute(fn, args, future)

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
    def pending(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._pending


_worker: Worker | None = None
_worker_lock = threading.Lock()
DRAIN_AT_EXIT_S = 60.0


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
    if _worker is not None and _worker.pending and not _worker.drain(DRAIN_AT_EXIT_S):
        log.warning(
            "neuron-mlflow: %d window(s) were still being finished at exit; they stay in the "
            "spool (run `neuron-mlflow sync` to upload them)",
            _worker.pending,
        )
