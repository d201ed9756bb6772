"""The engine: one profiling session drives capture, summary, spool and upload.

Front ends (the decorator, the Lightning callback) only say when a step begins and ends.
Outside a window a step costs a counter increment and one comparison: the profiler is
created when a window's warm-up begins and stopped when its last recorded step ends. The
step that ends a window only stops the profiler and lets the backend write its trace; the
rest of the window (summary, window folder, upload) is finished by the background worker
(:mod:`neuron_mlflow.engine.worker`, a process of its own). ``summary``, ``records`` and
``run_id`` read what it finished, and wait for it only when called.

Example:
    >>> import tempfile, torch
    >>> from neuron_mlflow import ProfilerConfig, Schedule
    >>> cfg = ProfilerConfig(backend="cpu", schedule=Schedule(warmup=1, active=2),
    ...                      local_dir=tempfile.mkdtemp())
    >>> session = ProfilingSession(cfg, upload=False)
    >>> for _ in range(4):
    ...     session.begin_step()
    ...     _ = torch.ones(8) * 2
    ...     _ = session.end_step()
    >>> session.summary.steps, session.summary.op_calls
    (2, 2.0)
    >>> session.close()
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.environment import rank_and_world_size
from neuron_mlflow.engine.guard import guarded, report
from neuron_mlflow.engine.handoff import Results
from neuron_mlflow.engine.lifecycle import WindowLifecycle, _capturing
from neuron_mlflow.engine.system_metrics import SystemMetrics, start_system_metrics
from neuron_mlflow.engine.upload import RunTarget
from neuron_mlflow.engine.worker import WorkerClient
from neuron_mlflow.naming import CALL_MARKER_PREFIX
from neuron_mlflow.schedule import Action, action_at, next_window_start_skipping
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.summary.ops import OpSummary

_open_sessions: weakref.WeakSet[ProfilingSession] = weakref.WeakSet()
"""Sessions not closed yet: at exit each waits (bounded) for the worker to finish its windows."""

WAIT_S = 60.0
"""How long ``summary``/``run_id``/``close()`` wait for the background worker."""


class ProfilingSession(WindowLifecycle):
    """Capture windows by schedule, summarise them, spool them, and log them to MLflow.

    Args:
        config: the configuration.
        prefix: the metric prefix ``P``; defaults to ``config.metric_prefix``.
        run_id: run to log into when no MLflow run is active.
        upload: ``False`` keeps windows in the spool only (pending).
        tracking_uri: the tracking server; ``None`` means what MLflow resolves at upload.
        rank: global rank and world size; default from ``torch.distributed`` or the
            environment.
        metric_step: returns the metric step of a finishing window; default: its last step.
        skip_windows: indexes of windows never to capture (already logged, e.g. before a
            resume); the caller may add to the set as it goes.
        traces_only: upload only the trace folder (for ranks other than 0, whose metrics,
            summaries, params and tags rank 0 logs).
        follow_active_run: ``False`` ignores an active MLflow run (``run_id`` decides).
        job_id: the job's id, decided once by rank 0 and shared by every rank: written into
            every window's manifest so that an offline job's ranks sync into one run.
        system_metrics: start the ``neuron-monitor`` sampler with the session when
            ``neuron.system_metrics`` asks for it (the Lightning callback runs its own).
        capture_ranks: the global ranks that capture (rank 0's worker logs the rank skew
            over them); default: every rank.
        rank_metrics: log this rank's own times as ``P/rank/<r>/...`` (always when there
            are several ranks).

    Raises:
        BackendUnavailableError: the configured backend cannot run here.

    The run of a window is the MLflow run active when the window ended, else ``run_id``,
    else a run this session creates once and reuses for later windows.
    """

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        prefix: str | None = None,
        run_id: str | None = None,
        upload: bool = True,
        tracking_uri: str | None = None,
        rank: tuple[int, int] | None = None,
        metric_step: Callable[[], int] | None = None,
        skip_windows: set[int] | None = None,
        traces_only: bool = False,
        follow_active_run: bool = True,
        job_id: str | None = None,
        system_metrics: bool = True,
        capture_ranks: tuple[int, ...] | None = None,
        rank_metrics: bool = False,
    ) -> None:
        self.config = config
        self.prefix = prefix or config.metric_prefix
        self.backend = resolve_backend(config.backend, config)
        self.upload_enabled = upload
        self.step_num = 0
        self.target = RunTarget(run_id, tracking_uri, follow_active_run)
        self._rank_info = rank
        self._metric_step = metric_step
        self.skip_windows = skip_windows if skip_windows is not None else set()
        self._traces_only = traces_only
        self.job_id = job_id
        self._spool = Spool(Path(config.local_dir).absolute())
        self._session_dir: Path | None = None
        self._capture: LiveWindow | None = None
        self._next_start = self._next_after(0)
        self._step_started_ns = 0
        self._closed = False
        self._disabled = False
        self._results = Results(WorkerClient(self._spool.root))
        self._capture_ranks = capture_ranks
        self._rank_metrics = rank_metrics
        _open_sessions.add(self)
        self._system: SystemMetrics | None = None
        if system_metrics:
            active = self.target.active_run()
            self._system = self._guarded(
                start_system_metrics,
                config,
                self.backend.name,
                lambda: self.target.known_run(active) or self._results.run_id,
                tracking_uri,
            )

    def _next_after(self, step: int) -> int | None:
        return next_window_start_skipping(self.config.schedule, self.skip_windows, step)

    def seek(self, step: int) -> None:
        """Set the number of the next step (e.g. ``trainer.global_step`` after a resume).

        Ignored while a window is open: a window's steps are consecutive.
        """
        if self._capture is None and step != self.step_num:
            self.step_num = step
            self._next_start = None if self._closed or self._disabled else self._next_after(step)

    # -- results (finished by the background worker) -------------------------------------

    def wait(self, timeout_s: float = WAIT_S) -> bool:
        """Wait (at most ``timeout_s``) for the windows handed to the worker; True when done.

        In strict mode a failure of ours while finishing a window is raised here.
        """
        return self._results.wait(timeout_s, strict=self.config.strict)

    def wait_summaries(self, timeout_s: float = WAIT_S) -> bool:
        """Wait (at most ``timeout_s``) until the windows handed to the worker are summarised
        and in the spool with their metrics (not for their upload); True when done."""
        return self._results.wait(timeout_s, strict=False, summaries_only=True)

    @property
    def summary(self) -> OpSummary | None:
        """The op summary of the last finished window (``None`` before the first).

        Waits for the worker to summarise the windows handed to it, never for their upload.
        """
        self._results.wait(WAIT_S, strict=self.config.strict, summaries_only=True)
        return self._results.summary

    @property
    def records(self) -> list[WindowRecord]:
        """The windows this session spooled and summarised, oldest first (no upload wait)."""
        self._results.wait(WAIT_S, strict=self.config.strict, summaries_only=True)
        return self._results.records

    @property
    def run_id(self) -> str | None:
        """The MLflow run the last window was logged to (``None`` if none was logged)."""
        self.wait()
        return self._results.run_id

    # -- stepping -----------------------------------------------------------------------

    def begin_step(self, call_name: str | None = None) -> None:
        """Mark the beginning of step ``step_num``; opens the profiler when a window begins.

        Args:
            call_name: marks the step's own work (a decorated call) so that only it is
                summarised, not what runs between steps. Use it for every step or none.
        """
        if self._capture is None:
            if self.step_num != self._next_start:
                return
            self._open_window(calls_marked=call_name is not None)
        capture = self._capture
        if capture is not None and call_name is not None:
            self._guarded(capture.enter_marker, CALL_MARKER_PREFIX + call_name)
        self._step_started_ns = time.perf_counter_ns()

    def end_step(self) -> WindowRecord | None:
        """Mark the end of step ``step_num``; closes the window after its last step.

        Returns:
            When this step finished a window, its spooled record (summarised and uploaded
            by the worker process), else ``None``.
        """
        capture = self._capture
        if capture is None:
            self.step_num += 1
            return None
        action = action_at(self.config.schedule, self.step_num)
        try:
            self._guarded(self.backend.synchronize)
            self._guarded(capture.exit_marker)
            if action in (Action.RECORD, Action.RECORD_AND_SAVE):
                capture.record_step(self.step_num, self._step_started_ns)
            self._guarded(capture.step)
        finally:
            self.step_num += 1
        if action == Action.RECORD_AND_SAVE:
            return self._finish_window(status="pending", partial=False)
        return None

    def step(self) -> None:
        """End the current step and begin the next (the context-manager protocol)."""
        self.end_step()
        self.begin_step()

    def abort(self, exc: BaseException) -> None:
        """The user's step raised ``exc``: stop the profiler, keep what was captured locally
        (status ``incomplete``), and go on counting steps. Never raises."""
        capture = self._capture
        if capture is None:
            self.step_num += 1
            return
        if action_at(self.config.schedule, self.step_num) != Action.WARMUP:
            # the failing step ran (in part) while recording: its work is in the capture
            capture.record_step(self.step_num, self._step_started_ns)
        self.step_num += 1
        with suppress(Exception):
            error = f"{type(exc).__name__}: {exc}"
            record = self._finish_window(status="incomplete", partial=True, error=error)
            if record is not None:
                report(
                    f"neuron-mlflow: the profiled code raised ({error}); what was captured "
                    f"is kept at {record.path} (incomplete, not uploaded; "
                    "`neuron-mlflow sync --include-incomplete` uploads it)"
                )

    def flush(self) -> WindowRecord | None:
        """Stop a window still open and log it as partial (the end of a stage); go on after.

        Returns:
            The spooled window, if one was open.
        """
        if self._capture is None:
            return None
        return self._finish_window(status="pending", partial=True)

    def close(self) -> None:
        """Stop a window still open (logged as partial), wait for the worker, end the session.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._next_start = None
        if not self.wait(self.config.upload_timeout_s):
            report(
                f"neuron-mlflow: profiling window(s) were not uploaded within "
                f"{self.config.upload_timeout_s:g} s (upload_timeout_s); the worker process "
                f"goes on for as long after this process ends, then they stay in "
                f"{self._spool.root}. Run `neuron-mlflow sync --local-dir {self._spool.root}` "
                "to upload them"
            )
        self._results.close()
        _open_sessions.discard(self)
        if self._system is not None:
            system, self._system = self._system, None
            self._guarded(system.stop)

    @property
    def window_open(self) -> bool:
        """True while a window (warm-up or recording) is being captured."""
        return self._capture is not None

    # -- windows ------------------------------------------------------------------------

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """Run our own code: a failure becomes one report and turns profiling off for this
        session (the profiled code goes on), unless ``config.strict``."""
        return guarded(self.config.strict, fn, *args, on_failure=self._turn_off)

    def guard(self, fn: Any, *args: Any) -> Any:
        """Run a front end's call into the engine (``begin_step``, ``end_step``, ``abort``)
        inside the guard: see :mod:`neuron_mlflow.engine.guard`. Once profiling is off these
        calls cost a comparison."""
        return guarded(self.config.strict, fn, *args, on_failure=self._turn_off)

    @property
    def disabled(self) -> bool:
        """True once a failure of ours turned profiling off for this session."""
        return self._disabled

    def _turn_off(self, exc: BaseException | None = None) -> None:
        """Stop capturing for good: the open window (if any) is dropped, no new one opens."""
        self._disabled = True
        self._next_start = None
        capture, self._capture = self._capture, None
        _capturing.discard(self)
        if capture is not None:
            with suppress(Exception):
                capture.exit_marker()
            with suppress(Exception):
                capture.stop()

    def _rank(self) -> tuple[int, int]:
        return self._rank_info or rank_and_world_size()

    def __repr__(self) -> str:
        return f"ProfilingSession(prefix={self.prefix!r}, step={self.step_num})"


@atexit.register
def _wait_at_exit() -> None:
    """At exit, an unclosed session (a decorated function) waits at most ``upload_timeout_s``
    for the worker to finish its windows, so the run is complete when the script ends."""
    for session in list(_open_sessions):
        with suppress(Exception):
            if not session.wait(session.config.upload_timeout_s):
                report(
                    f"neuron-mlflow: profiling window(s) were not uploaded within "
                    f"{session.config.upload_timeout_s:g} s (upload_timeout_s); they stay "
                    f"in {session._spool.root}. Run `neuron-mlflow sync --local-dir "
                    f"{session._spool.root}` to upload them"
                )
