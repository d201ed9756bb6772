"""The profiling session: a front end's steps, a window's capture, its hand-off to the worker.

Outside a window a step costs a counter and one comparison; ``summary``, ``records`` and
``run_id`` wait only when called. A window's path: docs/ARCHITECTURE.md.

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
import json
import shutil
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.capture.live import LiveWindow
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine import signals
from neuron_mlflow.engine.capture_requests import OnDemand
from neuron_mlflow.engine.environment import package_version, rank_and_world_size
from neuron_mlflow.engine.finish import end_record, session_record
from neuron_mlflow.engine.guard import Guard, report
from neuron_mlflow.engine.host_load import sample_host_load
from neuron_mlflow.engine.options import Options
from neuron_mlflow.engine.system_metrics import SystemMetrics, start_system_metrics
from neuron_mlflow.engine.worker import WorkerClient, queued_place
from neuron_mlflow.errors import NeuronMlflowError, NeuronMlflowWarning, WindowRequestRefused
from neuron_mlflow.naming import CALL_MARKER_PREFIX, trace_folder
from neuron_mlflow.schedule import (
    Action,
    Window,
    next_window_start_skipping,
    window_action,
    window_at,
)
from neuron_mlflow.sinks.claims import Claim
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.sinks.window_record import Window as Record
from neuron_mlflow.summary.ops import OpSummary, summary_from_dict

REQUESTED_BASE = 1_000_000
"""Requested windows are numbered from here (scheduled windows count from 0)."""

_open_sessions: weakref.WeakSet[ProfilingSession] = weakref.WeakSet()
"""Sessions not closed yet: at exit each waits (bounded) for the worker to finish its windows."""

WAIT_S = 60.0
"""How long ``summary``/``run_id``/``close()`` wait for the background worker."""


RESPAWN_CHECK_S = 1.0
"""While waiting, how often the wait checks that a worker still serves the queue."""


@dataclass
class _Handed:
    """One window handed to the worker, and what this process has read of it."""

    path: Path
    summary: OpSummary | None = None
    record: WindowRecord | None = None
    finished: bool = False
    reported: bool = False

    def read(self, summaries_only: bool) -> bool:
        """Read the window's manifest; True when the worker is done with what we wait for."""
        if self.finished:
            return True
        try:
            record = WindowRecord.load(self.path)
        except (OSError, ValueError):
            return False  # being written (atomically replaced): read it again
        if self.summary is None and record.window.summarised:
            try:
                data = json.loads((record.artifacts_dir / "summary.json").read_text("utf-8"))
                self.summary = summary_from_dict(data["summary"])
                self.record = record
            except (OSError, ValueError, KeyError):
                return False
        if record.window.handled or record.status == "done":  # (done by `sync`, maybe)
            self.record = record
            self.finished = True
            return True
        return summaries_only and self.summary is not None


def _last_run(handed: list[_Handed]) -> str | None:
    """The run the worker wrote into the last handed record that names one (no wait)."""
    for one in reversed(handed):
        try:
            run_id = WindowRecord.load(one.path).window.run_id
        except (OSError, ValueError):
            continue
        if run_id:
            return str(run_id)
    return None


class ProfilingSession:
    """Capture windows by schedule, summarise them, spool them, and log them to MLflow.

    Args:
        options: who this process is and where its windows go
            (:class:`~neuron_mlflow.engine.options.Options`, the same record for every front
            end); a bare ``ProfilerConfig`` stands for ``Options(config)``.
        prefix: the metric prefix ``P``; defaults to ``config.metric_prefix``.
        upload: ``False`` keeps windows in the spool only (pending); default
            ``options.upload``.
        metric_step: returns the metric step of a finishing window; default: its last step.
        skip_windows: indexes of windows never to capture (already logged, e.g. before a
            resume); the caller may add to the set as it goes.

    Raises:
        BackendUnavailableError: the configured backend cannot run here.

    The run of a window is the MLflow run active when the window ended, else
    ``options.run_id``, else a run this session creates once and reuses for later windows. A
    session of an attached front end (``options.attached``) follows no active run, leaves
    the system metrics and capture requests to it and logs this rank's own times as
    ``P/rank/<r>/...``; any other session runs its own.
    """

    def __init__(
        self,
        options: Options | ProfilerConfig,
        *,
        prefix: str | None = None,
        upload: bool | None = None,
        metric_step: Callable[[], int] | None = None,
        skip_windows: set[int] | None = None,
    ) -> None:
        if isinstance(options, ProfilerConfig):
            options = Options(options)
        self.options = options
        config = self.config = options.config
        # our code runs in the guard: a failure is one report and turns profiling off
        self.guarded = Guard(config.strict, self.turn_off)
        self.prefix = prefix or config.metric_prefix
        self.backend = resolve_backend(config.backend, config)
        self.upload_enabled = options.upload if upload is None else upload
        self.step_num = 0
        self._metric_step = metric_step
        self.skip_windows = skip_windows if skip_windows is not None else set()
        self._requested: list[tuple[Window, str]] = []
        self._requested_count = 0
        self._spool = Spool(Path(config.local_dir).absolute())
        self._session_dir: Path | None = None
        self._capture: LiveWindow | None = None
        self._next_start = self._next_after(0)
        self._step_started_ns = 0
        self._closed = False
        self.disabled = False
        package_version()  # read once now, not at the first window's end
        self.guarded(self.backend.describe)  # (platform.processor() runs `uname -p` once)
        self._worker = WorkerClient(self._spool.root)
        if self._next_start is not None:  # the worker imports MLflow before the first window
            with suppress(Exception):  # early is a bonus: the first window starts it anyway
                self._worker.ensure_running()
        self._handed: list[_Handed] = []  # read back from the spool only when asked
        self._handed_all = False  # close() told the worker: no more windows from here
        self._capturing_claim: Claim | None = None
        self._base: Record | None = None  # every window's common part (:meth:`_session_record`)
        self._stopped: LiveWindow | None = None  # the last window's profiler, to free
        _open_sessions.add(self)
        self._system: SystemMetrics | None = None
        self._watch: OnDemand | None = None
        if not options.attached:  # (an attached front end runs them for the whole job)
            active, handed = options.current_run(), self._handed

            def known_run() -> str | None:
                return active or _last_run(handed)

            self._system = self.guarded(
                start_system_metrics, config, self.backend.name, known_run, options.tracking_uri
            )
            self._watch = self.guarded(self._start_watch, known_run)

    def _start_watch(self, run: Callable[[], str | None]) -> OnDemand | None:
        """Capture requests and the slow-step trigger on this session's own steps."""
        rank, world_size = rank_and_world_size(self.options.rank, self.options.world_size)
        return OnDemand(
            self.config,
            self.prefix,
            rank=rank,
            world_size=world_size,
            request=self.request_window,
            busy=lambda: self.window_open,
            current_step=lambda: self.step_num,
            run=run,
            tracking_uri=self.options.tracking_uri,
        ).start()

    def _next_after(self, step: int) -> int | None:
        scheduled = next_window_start_skipping(self.config.schedule, self.skip_windows, step)
        requested = [w.start for w, _ in self._requested if w.start >= step]
        return min([s for s in (scheduled, *requested) if s is not None], default=None)

    def request_window(
        self, steps: int, warmup: int = 0, start: int | None = None, reason: str = "request"
    ) -> Window:
        """Capture a window outside the schedule: ``warmup`` steps, then ``steps`` recorded
        steps, from step ``start`` (default: the next step that begins). The window is an
        ordinary window (spooled, summarised and uploaded by the worker process) whose
        ``reason`` is kept with it. Call it on the training thread (between steps).

        Raises:
            WindowRequestRefused: profiling is off or closed, ``steps`` is below 1 or
                ``warmup`` below 0, ``start`` is already past, or the window would overlap
                one that is open, scheduled or requested (one window at a time); the
                message says which.
        """
        if self._closed or self.disabled:
            raise WindowRequestRefused("profiling is off in this process")
        if steps < 1 or warmup < 0:
            raise WindowRequestRefused(
                f"steps={steps}, warmup={warmup}: need steps >= 1 and warmup >= 0"
            )
        begin = self.step_num if start is None else start
        if self._capture is not None and begin <= self._capture.window.last:
            opened = self._capture.window
            raise WindowRequestRefused(
                f"step {begin} is inside the open window (steps {opened.start}-{opened.last}); "
                f"ask for a start after step {opened.last}"
            )
        if begin < self.step_num:
            raise WindowRequestRefused(f"step {begin} is past (the next step is {self.step_num})")
        window = Window(
            REQUESTED_BASE + self._requested_count, begin, begin + warmup,
            begin + warmup + steps - 1,
        )  # fmt: skip
        for other, _ in self._requested:
            if window.start <= other.last and other.start <= window.last:
                raise WindowRequestRefused(
                    f"steps {window.start}-{window.last} overlap the requested window of "
                    f"steps {other.start}-{other.last}"
                )
        for step in range(window.start, window.last + 1):
            scheduled = window_at(self.config.schedule, step)
            if scheduled is not None and scheduled.index not in self.skip_windows:
                raise WindowRequestRefused(
                    f"steps {window.start}-{window.last} overlap the scheduled window of "
                    f"steps {scheduled.start}-{scheduled.last}"
                )
        self._requested.append((window, reason))
        self._requested_count += 1
        if self._capture is None:
            self._next_start = self._next_after(self.step_num)
        return window

    def seek(self, step: int) -> None:
        """Set the number of the next step (e.g. ``trainer.global_step`` after a resume).

        Ignored while a window is open: a window's steps are consecutive.
        """
        if self._capture is None and step != self.step_num:
            self.step_num = step
            self._next_start = None if self._closed or self.disabled else self._next_after(step)

    # -- results (finished by the background worker) -------------------------------------

    def wait(self, timeout_s: float = WAIT_S) -> bool:
        """Wait (at most ``timeout_s``) for the windows handed to the worker; True when done.

        In strict mode a failure of ours while finishing a window is raised here.
        """
        return self._wait(timeout_s, self.config.strict)

    def wait_summaries(self, timeout_s: float = WAIT_S) -> bool:
        """Wait (at most ``timeout_s``) until the windows handed to the worker are summarised
        (not for their upload); True when done."""
        return self._wait(timeout_s, strict=False, summaries_only=True)

    def _wait(self, timeout_s: float, strict: bool, summaries_only: bool = False) -> bool:
        """A failure of the worker is reported once (a warning), or raised when ``strict``."""
        try:
            with self._worker.hurried():
                deadline = time.monotonic() + timeout_s
                next_check = time.monotonic() + RESPAWN_CHECK_S
                for handed in self._handed:
                    while not handed.read(summaries_only):
                        now = time.monotonic()
                        if now >= deadline:
                            return False
                        if now >= next_check:
                            self._worker.ensure_running()  # a worker that died is started again
                            next_check = now + RESPAWN_CHECK_S
                        time.sleep(min(0.005, max(0.0, deadline - now)))
                    self._report(handed, strict)
                return True
        finally:
            if self._handed_all:  # (ensure_running registered it again)
                self._worker.close()

    def _report(self, handed: _Handed, strict: bool) -> None:
        record = handed.record
        if not handed.finished or handed.reported or record is None:
            return
        handed.reported = True
        error, step = record.window.error, record.window.failed_step
        if not error or step is None:
            return
        if strict:
            raise NeuronMlflowError(f"neuron-mlflow: {error}")
        if step == "upload":
            report(
                f"neuron-mlflow: {error}; it is kept at {record.path} (pending). Run "
                f"`neuron-mlflow sync --local-dir {self._worker.root}` to upload it later"
            )
        else:
            report(f"neuron-mlflow: {error}")

    @property
    def summary(self) -> OpSummary | None:
        """The op summary of the last finished window (``None`` before the first).

        Waits for the worker to summarise the windows handed to it, never for their upload.
        """
        self._wait(WAIT_S, self.config.strict, summaries_only=True)
        return next((h.summary for h in reversed(self._handed) if h.summary is not None), None)

    @property
    def records(self) -> list[WindowRecord]:
        """The windows this session spooled and summarised, oldest first (no upload wait)."""
        self._wait(WAIT_S, self.config.strict, summaries_only=True)
        return [h.record for h in self._handed if h.record is not None and h.summary is not None]

    @property
    def run_id(self) -> str | None:
        """The MLflow run the last window was logged to (``None`` if none was logged)."""
        self.wait()
        done = [
            h.record for h in self._handed if h.record is not None and h.record.status == "done"
        ]
        return next((str(r.window.run_id) for r in reversed(done) if r.window.run_id), None)

    # -- stepping -----------------------------------------------------------------------

    def begin_step(self, call_name: str | None = None) -> None:
        """Mark the beginning of step ``step_num``; opens the profiler when a window begins.

        Args:
            call_name: marks the step's own work (a decorated call) so that only it is
                summarised, not what runs between steps. Use it for every step or none.
        """
        watch = self._watch
        if watch is not None and watch.hot:  # a capture request or the slow-step trigger
            watch.tick(self.step_num)
        if self._capture is None:
            if self.step_num != self._next_start:
                return
            self._open_window()
        capture = self._capture
        if capture is not None:
            capture.step_start = capture.probe.sample()  # interference, outside the step's range
            if call_name is not None:
                self.guarded(capture.enter_marker, CALL_MARKER_PREFIX + call_name)
        self._step_started_ns = time.perf_counter_ns()

    def end_step(self) -> WindowRecord | None:
        """Mark the end of step ``step_num``; closes the window after its last step.

        Returns:
            When this step finished a window, its record (queued for the worker), else
            ``None``.
        """
        capture = self._capture
        if capture is None:
            self.step_num += 1
            return None
        action = window_action(capture.window, self.step_num)
        try:
            self.guarded(self.backend.synchronize)
            self.guarded(capture.exit_marker)
            if action in (Action.RECORD, Action.RECORD_AND_SAVE):
                capture.record_step(self.step_num, self._step_started_ns)
            self.guarded(capture.step)
        finally:
            self.step_num += 1
        if action == Action.RECORD_AND_SAVE:
            return self._finish_window(cut_short=False)
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
        if window_action(capture.window, self.step_num) != Action.WARMUP:
            # the failing step ran (in part) while recording: its work is in the capture
            capture.record_step(self.step_num, self._step_started_ns)
        self.step_num += 1
        with suppress(Exception):
            error = f"{type(exc).__name__}: {exc}"
            record = self._finish_window(error=error)
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
        return self._finish_window()

    def close(self) -> None:
        """Stop a window still open (logged as partial), hand what is left to the worker
        process and end the session: no thread, signal handler or exit hook of this session
        stays. It waits for no upload (call :meth:`wait` first for that), except, at most
        ``upload_timeout_s``, for a window whose on-demand asker awaits its ``done`` answer or
        for the run that neuron-monitor samples wait for. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._release_stopped()
        self._next_start = None
        watch, self._watch = self._watch, None
        if watch is not None:
            if watch.awaiting_windows:
                self.guarded(self.wait, self.config.upload_timeout_s)
            self.guarded(watch.close)
        self._handed_all = True  # the worker finishes the queue, then exits
        self._worker.close()
        _open_sessions.discard(self)
        if not signals.capturing:  # no window open in this process: SIGTERM's handler goes back
            signals.uninstall()
        if self._system is not None:
            system, self._system = self._system, None
            system.sampler.stop()  # no more samples; those taken wait for their run
            needs_run: bool | None = self.guarded(system.needs_run)
            if needs_run and self._handed:  # the run comes with the first upload
                self.guarded(self.wait, self.config.upload_timeout_s)
            self.guarded(system.stop)

    @property
    def next_window_step(self) -> int | None:
        """The first step that can touch a window: the next step while one is open, else
        the next window's start; ``None`` when none is left (or the session is off)."""
        return self.step_num if self._capture is not None else self._next_start

    @property
    def window_open(self) -> bool:
        """True while a window (warm-up or recording) is being captured."""
        return self._capture is not None

    # -- windows ------------------------------------------------------------------------

    def _end_capturing(self) -> None:
        """The worker may run its jobs again (this window's lock leaves ``.capturing/``)."""
        held, self._capturing_claim = self._capturing_claim, None
        if held is not None:
            self._worker.captured(held)

    def turn_off(self, exc: BaseException | None = None) -> None:
        """Stop capturing for good: the open window (if any) is dropped, no new one opens."""
        self.disabled = True
        self._next_start = None
        capture, self._capture = self._capture, None
        signals.capturing.discard(self)
        self._end_capturing()
        if capture is not None:
            with suppress(Exception):
                capture.exit_marker()
            with suppress(Exception):
                capture.stop()
                capture.release()
        with suppress(Exception):
            self._release_stopped()

    def _release_stopped(self) -> None:
        """Free the last window's stopped profiler (:meth:`LiveWindow.release`)."""
        stopped, self._stopped = self._stopped, None
        if stopped is not None:
            self.guarded(stopped.release)

    def _open_window(self) -> None:
        self._release_stopped()
        requested = [(w, r) for w, r in self._requested if w.start == self.step_num]
        reason = "schedule"
        if requested:
            window, reason = requested[0]
            self._requested.remove(requested[0])
        else:
            found = window_at(self.config.schedule, self.step_num)
            assert found is not None and found.start == self.step_num  # schedule invariant
            window = found
        self._next_start = self._next_after(window.last + 1)
        busy = [other.prefix for other in signals.capturing if other is not self]
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
        staging = Spool.capture_dir(self._session_dir, window.index, self.prefix)
        rank = rank_and_world_size(self.options.rank, self.options.world_size)[0]
        trace_dir = staging / "artifacts" / trace_folder(rank)
        capture = LiveWindow(window, self.backend, self.config, staging, trace_dir)
        capture.host_load = sample_host_load()
        capture.reason = reason
        # the claim first: a worker that sees it does not leave before the window's job
        self._capturing_claim = self.guarded(self._worker.capturing)
        try:
            self.guarded(self._worker.ensure_running)  # a worker runs, before the window
            self.guarded(self._session_record)  # made once, before the profiler starts
            self.guarded(capture.start)
        finally:
            if capture.prof is None:  # it did not start (strict mode raised, or off)
                self._end_capturing()
        if capture.prof is not None:
            self._capture = capture
            signals.capturing.add(self)
            signals.install()  # SIGTERM keeps the open window

    def _session_record(self) -> Record:
        """Every window's common part (:func:`finish.session_record`), made once."""
        if self._base is None:
            assert self._session_dir is not None
            rank, world_size = rank_and_world_size(self.options.rank, self.options.world_size)
            self._base = session_record(
                self.config, self.backend, self.prefix, self._session_dir.name, rank=rank,
                world_size=world_size, traces_only=self.options.traces_only,
                job_id=self.options.job_id, rank_metrics=self.options.attached,
            )  # fmt: skip
        return self._base

    def _finish_window(
        self, cut_short: bool = True, error: str | None = None
    ) -> WindowRecord | None:
        """Stop the profiler, write the window's record and queue it for the worker; a window
        ``cut_short`` (partial; incomplete given the user's ``error``) is put in place here
        first, as the process may end next. Returns its record (``path``: where it goes)."""
        capture = self._capture
        if capture is None:
            return None
        self._capture = None
        signals.capturing.discard(self)
        try:  # the capturing claim is released after the job is queued
            self.guarded(capture.exit_marker)
            self.guarded(capture.stop)
            self._stopped = capture  # freed when the next window opens, or at close
            if capture.recorded_steps == 0:  # interrupted during warm-up
                shutil.rmtree(capture.staging, ignore_errors=True)
                return None
            base = self.guarded(self._session_record)
            if base is None:
                return None
            upload = self.upload_enabled and error is None
            skew = None
            if base.rank == 0 and base.world_size > 1 and upload:
                skew = sorted(self.options.capture_ranks or range(base.world_size))
            window = self.guarded(
                end_record, base, capture, status="pending" if error is None else "incomplete",
                partial=cut_short, error=error,
                metric_step=None if self._metric_step is None else self._metric_step(),
                run_id=self.options.current_run(),
                tracking_uri=self.options.tracking_uri, upload=upload, skew_ranks=skew,
            )  # fmt: skip
            if window is None:
                return None
            path = queued_place(self._spool.root, window)
            if cut_short:  # in place before the step returns, then queued
                record = self.guarded(self._spool.place, window)
                if record is not None:
                    self.guarded(self._hand_off, path, window)
                return record
            if self.guarded(self._hand_off, path, window) is None:
                # the record could not be queued: the window goes in place here, for `sync`
                return self.guarded(self._spool.place, window)
            return WindowRecord(path=path, window=window)
        finally:  # a worker that sees neither the job nor the claim may leave
            self._end_capturing()

    def _hand_off(self, path: Path, window: Record) -> Path:
        """Queue the window's record for the worker (it puts the window at ``path``)."""
        job = self._worker.submit(window)
        self._handed.append(_Handed(path))
        return job

    def __repr__(self) -> str:
        return f"ProfilingSession(prefix={self.prefix!r}, step={self.step_num})"


def wait_at_exit(sessions: Iterable[ProfilingSession]) -> None:
    """Each session waits at most ``upload_timeout_s`` for the worker to finish its windows;
    windows left are reported with the ``sync`` command. Never raises."""
    for session in sessions:
        with suppress(Exception):
            if not session.wait(session.config.upload_timeout_s):
                report(
                    f"neuron-mlflow: profiling window(s) were not uploaded within "
                    f"{session.config.upload_timeout_s:g} s (upload_timeout_s); they stay "
                    f"in {session._spool.root}. Run `neuron-mlflow sync --local-dir "
                    f"{session._spool.root}` to upload them"
                )


@atexit.register
def _wait_at_exit() -> None:
    """At exit, a session nobody closed waits (:func:`wait_at_exit`); a closed one does not:
    the worker process finishes its windows on its own."""
    wait_at_exit(list(_open_sessions))
