"""A live window's opening and closing, the part of the session that touches the profiler.

:class:`WindowLifecycle` is the base of :class:`~neuron_mlflow.engine.session.ProfilingSession`:
it opens a :class:`~neuron_mlflow.capture.live.LiveWindow` when a window's warm-up begins and,
after its last step, stops it, spools the window (manifest + traces, on the training thread)
and queues the rest for the worker process (:mod:`neuron_mlflow.engine.handoff`).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.engine import signals
from neuron_mlflow.engine.finish import FinishJob, spool_live
from neuron_mlflow.engine.handoff import Results
from neuron_mlflow.engine.host_load import sample_host_load
from neuron_mlflow.engine.worker import Job, SkewRequest
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
    _capture_ranks: tuple[int, ...] | None
    _rank_metrics: bool

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
        capture.host_load = sample_host_load()
        self._guarded(capture.start)
        if capture.prof is not None:
            self._capture = capture
            _capturing.add(self)
            signals.install(lambda: list(_capturing))  # SIGTERM keeps the open window

    def _finish_window(
        self, status: str, partial: bool, error: str | None = None
    ) -> WindowRecord | None:
        """Stop the profiler here (the trace is written), spool the window and queue it for
        the worker process: all the training thread does. Returns the spooled record."""
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
            rank_metrics=self._rank_metrics,
        )
        self._guarded(spool_live, job)  # the window is in the spool before the step returns
        record = job.record
        if record is None:
            return None
        record.release()  # the worker process claims it
        skew = None
        if rank == 0 and world_size > 1 and job.upload:
            ranks = self._capture_ranks or tuple(range(world_size))
            skew = SkewRequest(self.prefix, int(record.manifest["metric_step"]), tuple(ranks))
        handed = Job(
            window=record.path.relative_to(self._spool.root.absolute()).as_posix(),
            upload=job.upload,
            upload_timeout_s=self.config.upload_timeout_s,
            skew=skew,
        )
        self._guarded(self._results.hand_off, record, handed)
        return record
