"""A live window's opening and closing, the part of the session that touches the profiler.

:class:`WindowLifecycle` is the base of :class:`~neuron_mlflow.engine.session.ProfilingSession`:
it opens a :class:`~neuron_mlflow.capture.live.LiveWindow` when a window's warm-up begins and,
after its last step, stops it, spools the window (manifest + traces, on the training thread)
and hands the rest to the background worker (:mod:`neuron_mlflow.engine.handoff`).

Example:
    >>> from neuron_mlflow import ProfilerConfig
    >>> from neuron_mlflow.engine.session import ProfilingSession
    >>> issubclass(ProfilingSession, WindowLifecycle)
    True
"""

from __future__ import annotations

import shutil
import warnings
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.engine import signals
from neuron_mlflow.engine.finish import FinishJob, Results, spool_live
from neuron_mlflow.engine.handoff import hand_off
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.naming import trace_folder
from neuron_mlflow.schedule import window_at
from neuron_mlflow.sinks.spool import Spool, WindowRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from neuron_mlflow.capture.backends.base import Backend
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.upload import RunTarget

_capturing: weakref.WeakSet[WindowLifecycle] = weakref.WeakSet()
"""Sessions with an open window: torch.profiler cannot run two captures at once."""


class WindowLifecycle:
    """Opening and finishing live windows; the session holds the state it reads."""

    config: ProfilerConfig
    prefix: str
    backend: Backend
    step_num: int
    upload_enabled: bool
    target: RunTarget
    job_id: str | None
    _spool: Spool
    _session_dir: Path | None
    _capture: LiveWindow | None
    _next_start: int | None
    _results: Results
    _metric_step: Callable[[], int] | None
    _traces_only: bool

    def _next_after(self, step: int) -> int | None:
        raise NotImplementedError

    def _guarded(self, fn: Any, *args: Any) -> Any:
        raise NotImplementedError

    def _rank(self) -> tuple[int, int]:
        raise NotImplementedError

    def _open_window(self, calls_marked: bool) -> None:
        window = window_at(self.config.schedule, self.step_num)
        assert window is not None and window.start == self.step_num  # schedule invariant
        self._next_start = self._next_after(window.last + 1)
        busy = [other.prefix for other in _capturing if other is not self]
        if busy:
            warnings.warn(
                f"neuron-mlflow: window {window.index} of {self.prefix} (steps "
                f"{window.first}-{window.last}) skipped: a window of {busy[0]} is still open, "
                "and torch.profiler cannot run two captures at once",
                NeuronMlflowWarning,
                stacklevel=4,
            )
            return
        if self._session_dir is None:
            self._session_dir = self._spool.new_session_dir()
        staging = Spool.capture_dir(self._session_dir, window.index)
        trace_dir = staging / "artifacts" / trace_folder(self._rank()[0])
        capture = LiveWindow(
            window, self.backend, self.config, staging, trace_dir, calls_marked=calls_marked
        )
        self._guarded(capture.start)
        if capture.prof is not None:
            self._capture = capture
            _capturing.add(self)
            signals.install(lambda: list(_capturing))  # SIGTERM keeps the open window

    def _finish_window(
        self, status: str, partial: bool, error: str | None = None, inline: bool = False
    ) -> Future[WindowRecord | None] | None:
        """Stop the profiler here (the trace is written), then finish on the worker."""
        capture = self._capture
        if capture is None:
            return None
        self._capture = None
        _capturing.discard(self)
        self._guarded(capture.exit_marker)
        self._guarded(capture.stop)
        if capture.recorded_steps == 0:
            # Interrupted during warm-up: nothing was recorded.
            shutil.rmtree(capture.staging, ignore_errors=True)
            return None
        assert self._session_dir is not None
        rank, world_size = self._rank()
        job = FinishJob(
            capture=capture,
            prefix=self.prefix,
            spool=self._spool,
            session_dir=self._session_dir,
            status=status,
            partial=partial,
            error=error,
            rank=rank,
            world_size=world_size,
            metric_step=None if self._metric_step is None else self._metric_step(),
            traces_only=self._traces_only,
            job_id=self.job_id,
            upload=self.upload_enabled and status != "incomplete",
            target=self.target,
            active_run=self.target.active_run(),
        )
        self._guarded(spool_live, job)  # the window is in the spool before the step returns
        return hand_off(self._results, job, str(self._spool.root), self.config, inline)
