"""The engine: one profiling session drives capture, summary, spool and upload.

Front ends (the decorator, the Lightning callback) only say when a step begins and ends.
Outside a window a step costs a counter increment and one comparison: the profiler is
created when a window's warm-up begins and stopped when its last recorded step ends.

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

import os
import shutil
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.capture.profile_reader import CALL_MARKER_PREFIX, CapturedStats, read_profile
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.environment import environment_tags, rank_and_world_size
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.naming import trace_folder, window_artifact_path, window_metrics
from neuron_mlflow.schedule import Action, Window, action_at, next_window_start, window_at
from neuron_mlflow.sinks.spool import Spool, WindowRecord, write_summary_files
from neuron_mlflow.summary.ops import OpSummary, build_summary

if TYPE_CHECKING:
    import torch.profiler


_capturing: weakref.WeakSet[ProfilingSession] = weakref.WeakSet()
"""Sessions with an open window: torch.profiler cannot run two captures at once."""


@dataclass
class _Capture:
    """A running window: its profiler and what it has recorded so far."""

    window: Window
    prof: torch.profiler.profile | None
    staging: Path
    trace_dir: Path
    recorded_steps: int = 0
    last_recorded: int = -1
    wall_ns: int = 0
    stats: CapturedStats | None = None
    errors: list[str] = field(default_factory=list)
    calls_marked: bool = False
    marker: Any = None

    def record_step(self, step: int, started_ns: int) -> None:
        """Count ``step`` as recorded, with its wall time since ``started_ns``."""
        self.wall_ns += time.perf_counter_ns() - started_ns
        self.recorded_steps += 1
        self.last_recorded = step


def _enter_marker(name: str) -> Any:
    import torch.profiler

    marker = torch.profiler.record_function(name)
    marker.__enter__()
    return marker


class ProfilingSession:
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

    Raises:
        BackendUnavailableError: the configured backend cannot run here.

    The run of a window is resolved when it is uploaded: the active MLflow run if any, else
    ``run_id``, else a run this session creates once and reuses for later windows.
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
    ) -> None:
        self.config = config
        self.prefix = prefix or config.metric_prefix
        self.backend = resolve_backend(config.backend, config)
        self.upload_enabled = upload
        self.step_num = 0
        self.summary: OpSummary | None = None
        self.run_id: str | None = None
        self.records: list[WindowRecord] = []
        self._explicit_run_id = run_id
        self._own_run_id: str | None = None
        self._tracking_uri = tracking_uri
        self._rank_info = rank
        self._metric_step = metric_step
        self.skip_windows = skip_windows if skip_windows is not None else set()
        self._traces_only = traces_only
        self._follow_active_run = follow_active_run
        self._spool = Spool(Path(config.local_dir).absolute())
        self._session_dir: Path | None = None
        self._capture: _Capture | None = None
        self._next_start = self._next_unskipped_start(0)
        self._step_started_ns = 0
        self._closed = False

    def _next_unskipped_start(self, step: int) -> int | None:
        schedule = self.config.schedule
        start = next_window_start(schedule, step)
        while start is not None:
            window = window_at(schedule, start)
            if window is None or window.index not in self.skip_windows:
                return start
            start = next_window_start(schedule, window.last + 1)
        return None

    def seek(self, step: int) -> None:
        """Set the number of the next step (e.g. ``trainer.global_step`` after a resume).

        Ignored while a window is open: a window's steps are consecutive.
        """
        if self._capture is None and step != self.step_num:
            self.step_num = step
            self._next_start = None if self._closed else self._next_unskipped_start(step)

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
            capture.marker = self._guarded(_enter_marker, CALL_MARKER_PREFIX + call_name)
        self._step_started_ns = time.perf_counter_ns()

    def end_step(self) -> WindowRecord | None:
        """Mark the end of step ``step_num``; closes and logs the window after its last step.

        Returns:
            The spooled window when this step finished one, else ``None``.
        """
        capture = self._capture
        if capture is None:
            self.step_num += 1
            return None
        action = action_at(self.config.schedule, self.step_num)
        try:
            self._guarded(self.backend.synchronize)
            self._exit_marker(capture)
            if action in (Action.RECORD, Action.RECORD_AND_SAVE):
                capture.record_step(self.step_num, self._step_started_ns)
            self._guarded(capture.prof.step)
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
            self._finish_window(
                status="incomplete", partial=True, error=f"{type(exc).__name__}: {exc}"
            )

    def flush(self) -> WindowRecord | None:
        """Stop a window still open and log it as partial (the end of a stage); go on after.

        Returns:
            The spooled window, if one was open and had recorded steps.
        """
        if self._capture is None:
            return None
        return self._finish_window(status="pending", partial=True)

    def close(self) -> None:
        """Stop a window still open (logged as partial) and end the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._next_start = None

    @property
    def window_open(self) -> bool:
        """True while a window (warm-up or recording) is being captured."""
        return self._capture is not None

    # -- windows ------------------------------------------------------------------------

    def _exit_marker(self, capture: _Capture) -> None:
        if capture.marker is not None:
            marker, capture.marker = capture.marker, None
            self._guarded(marker.__exit__, None, None, None)

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """Run our own code: a failure becomes one warning, unless ``config.strict``."""
        try:
            return fn(*args)
        except Exception as exc:
            if self.config.strict:
                raise
            warnings.warn(
                f"neuron-mlflow: {getattr(fn, '__qualname__', fn)} failed: "
                f"{type(exc).__name__}: {exc}; the profiled code goes on",
                NeuronMlflowWarning,
                stacklevel=3,
            )
            return None

    def _open_window(self, calls_marked: bool) -> None:
        import torch.profiler

        window = window_at(self.config.schedule, self.step_num)
        assert window is not None and window.start == self.step_num  # schedule invariant
        self._next_start = self._next_unskipped_start(window.last + 1)
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
        trace_dir.mkdir(parents=True, exist_ok=True)
        schedule = self.config.schedule

        def torch_schedule(relative_step: int) -> torch.profiler.ProfilerAction:
            step = window.start + relative_step
            if step > window.last:
                return torch.profiler.ProfilerAction.NONE
            return torch.profiler.ProfilerAction[action_at(schedule, step).name]

        capture = _Capture(window, None, staging, trace_dir, calls_marked=calls_marked)

        def on_trace_ready(prof: torch.profiler.profile) -> None:
            try:
                capture.stats = read_profile(prof, calls_marked=capture.calls_marked)
            except Exception as exc:
                capture.errors.append(f"reading the profile failed: {type(exc).__name__}: {exc}")
            try:
                self.backend.export_trace(prof, trace_dir)
            except Exception as exc:
                capture.errors.append(f"writing the trace failed: {type(exc).__name__}: {exc}")

        cfg = self.config

        def start() -> torch.profiler.profile:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                prof = torch.profiler.profile(
                    activities=self.backend.activities(),
                    schedule=torch_schedule,
                    on_trace_ready=on_trace_ready,
                    record_shapes=cfg.record_shapes,
                    with_stack=cfg.with_stack,
                    profile_memory=cfg.profile_memory,
                    with_flops=cfg.with_flops,
                    **self.backend.profiler_kwargs(cfg, trace_dir),
                )
                prof.start()
            return prof

        capture.prof = self._guarded(start)
        if capture.prof is not None:
            self._capture = capture
            _capturing.add(self)

    def _stop_profiler(self, capture: _Capture) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            capture.prof.stop()

    def _finish_window(
        self, status: str, partial: bool, error: str | None = None
    ) -> WindowRecord | None:
        capture = self._capture
        if capture is None:
            return None
        self._capture = None
        _capturing.discard(self)
        self._exit_marker(capture)
        self._guarded(self._stop_profiler, capture)
        if capture.recorded_steps == 0:
            # Interrupted during warm-up: nothing was recorded.
            shutil.rmtree(capture.staging, ignore_errors=True)
            return None
        record = self._guarded(self._spool_window, capture, status, partial, error)
        if record is None:
            warnings.warn(
                f"neuron-mlflow: could not write the window's summary; its raw capture is kept "
                f"at {capture.staging}",
                NeuronMlflowWarning,
                stacklevel=3,
            )
            return None
        self.records.append(record)
        if status == "incomplete":
            warnings.warn(
                f"neuron-mlflow: the profiled code raised ({error}); what was captured is kept "
                f"at {record.path} (incomplete, not uploaded; "
                f"`neuron-mlflow sync --include-incomplete` uploads it)",
                NeuronMlflowWarning,
                stacklevel=3,
            )
        elif self.upload_enabled:
            self._upload(record)
        return record

    def _rank(self) -> tuple[int, int]:
        return self._rank_info or rank_and_world_size()

    def _spool_window(
        self, capture: _Capture, status: str, partial: bool, error: str | None
    ) -> WindowRecord:
        assert self._session_dir is not None
        window = capture.window
        first, last = window.first, capture.last_recorded
        artifact_path = window_artifact_path(self.prefix, first, last)
        stats = capture.stats or CapturedStats()
        stats, device_time_source = self.backend.refine_device_time(stats, capture.trace_dir)
        summary = build_summary(
            stats.cpu_ops,
            top_level_calls=stats.top_level_calls,
            steps=capture.recorded_steps,
            wall_time_us=capture.wall_ns / 1000.0,
            device_label=self.backend.device_label,
            device_rows=stats.device_rows,
        ).with_partial(partial)
        rank, world_size = self._rank()
        tags = environment_tags(self.backend.describe(), rank, world_size)
        if partial:
            tags[f"neuron_mlflow.partial/{artifact_path}"] = "true"
        if device_time_source is not None:
            tags["neuron_mlflow.device_time_source"] = device_time_source
        metric_step = last if self._metric_step is None else self._metric_step()
        metrics = window_metrics(summary, self.prefix, self.config.top_k)
        params = {f"{self.prefix}/config/{k}": v for k, v in self.config.flat_params().items()}
        errors = [*capture.errors, *([error] if error else [])]
        record = self._spool.create_window(
            self._session_dir,
            artifact_path,
            status="incomplete",  # until every file is written
            metrics=metrics,
            params=params,
            tags=tags,
            metric_step=metric_step,
            traces_only=self._traces_only,
            window={"index": window.index, "first": first, "last": last, "partial": partial},
            experiment_name=self.config.experiment_name,
            run_name=self.config.run_name,
            upload_traces=self.config.upload_traces,
            tracking_uri=None,
            error="; ".join(errors) or None,
        )
        artifacts = record.artifacts_dir
        shutil.rmtree(artifacts)
        os.replace(capture.staging / "artifacts", artifacts)
        shutil.rmtree(capture.staging, ignore_errors=True)
        document = {
            "prefix": self.prefix,
            "window": record.manifest["window"],
            "config": self.config.model_dump(mode="json"),
            "environment": tags,
            "errors": errors,
        }
        write_summary_files(artifacts, summary, f"{self.prefix}: steps {first}-{last}", document)
        self.summary = summary
        record.update(status=status)
        return record

    def _known_run(self) -> str | None:
        """The run resolved without contacting MLflow: active run, ``run_id``, or our own."""
        from neuron_mlflow.sinks.mlflow_sink import active_run_id

        active = active_run_id() if self._follow_active_run else None
        return active or self._explicit_run_id or self._own_run_id

    def _upload(self, record: WindowRecord) -> None:
        from neuron_mlflow.sinks.mlflow_sink import MlflowSink

        sink = None
        try:
            sink = MlflowSink(self._tracking_uri)
            run_id = self._known_run()
            record.update(tracking_uri=sink.tracking_uri, run_id=run_id)
            sink.check_reachable()
            if run_id is None:
                run_id = self._own_run_id = sink.create_run(
                    self.config.experiment_name,
                    self.config.run_name,
                    tags=environment_tags(self.backend.describe(), *self._rank()),
                )
            sink.upload(record, run_id)
            self.run_id = run_id
        except Exception as exc:
            record.update(error=f"{type(exc).__name__}: {exc}")
            if self.config.strict:
                raise
            uri = sink.tracking_uri if sink is not None else "the tracking server"
            warnings.warn(
                f"neuron-mlflow: could not log the profiling window to MLflow at {uri} "
                f"({type(exc).__name__}: {str(exc)[:300]}); it is kept at {record.path} "
                f"(pending). Run `neuron-mlflow sync --local-dir {self.config.local_dir}` to "
                "upload it later",
                NeuronMlflowWarning,
                stacklevel=4,
            )
