"""A training framework's profiling, whole: what every step-driven front end shares.

A front end is its framework's hooks plus calls into one :class:`Attachment`: ``start`` when
the loop is set up, the stages' :class:`~neuron_mlflow.engine.stages.StageWindows` in the step
hooks, ``start_watch`` when the loop starts, ``end`` when it ends or raised, and ``wait``.

Example:
    >>> import tempfile, torch
    >>> import neuron_mlflow as nm
    >>> config = nm.ProfilerConfig(backend="cpu", local_dir=tempfile.mkdtemp(),
    ...                            schedule=nm.Schedule(warmup=1, active=2))
    >>> attach = Attachment(config, stages=("train",))
    >>> attach.start(rank=0, world_size=1)
    >>> windows = attach.windows["train"]
    >>> for step in range(4):
    ...     if not windows.begin_quiet(step):
    ...         attach.guard(windows.begin, step)
    ...     _ = torch.ones(8) * 2
    ...     if not windows.end_quiet():
    ...         attach.guard(windows.end, step + 1)
    >>> attach.end()
    >>> attach.wait(), windows.summary.steps
    (True, 2)
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.capture_requests import start_for_stage
from neuron_mlflow.engine.environment import rank_and_world_size
from neuron_mlflow.engine.guard import Guard
from neuron_mlflow.engine.options import Broadcast, Options
from neuron_mlflow.engine.runs import end_run
from neuron_mlflow.engine.session import ProfilingSession
from neuron_mlflow.engine.stages import StageWindows, check_ranks, check_stages
from neuron_mlflow.engine.system_metrics import SystemMetrics, start_system_metrics
from neuron_mlflow.engine.worker import WorkerClient
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.summary.ops import OpSummary


class Attachment:
    """One front end's profiling of a training job: its options, stages, worker and watcher.

    Args:
        config: the effective configuration.
        stages: the stages profiled (each has its own step counter, schedule and metric
            prefix ``<metric_prefix>/<stage>``); ``all_stages`` lists every stage the front
            end knows (their windows exist, unprofiled, so that checkpoint state round-trips).
        ranks: global ranks that capture (default: all).
        name: the front end's name, which starts its warnings.

    Raises:
        ConfigError: a bad stage or rank (the message lists what is allowed).
        BackendUnavailableError: the backend cannot run here (at once, not mid-training).

    See the module docstring for an example.
    """

    def __init__(
        self,
        config: ProfilerConfig,
        stages: str | Iterable[str] = ("train",),
        ranks: Iterable[int] | None = None,
        all_stages: Iterable[str] | None = None,
        name: str = "neuron-mlflow",
    ) -> None:
        self.config = config
        self.name = name
        self.stages = check_stages(stages, None if all_stages is None else tuple(all_stages))
        self.ranks = check_ranks(ranks)
        self.backend_name = resolve_backend(config.backend, config).name  # fail now
        self.options: Options | None = None
        self.off = False
        """A failure of ours turned profiling off for this front end."""
        self.windows = {stage: self._stage_windows(stage) for stage in (all_stages or self.stages)}
        self.profiled = {s: w if s in self.stages else None for s, w in self.windows.items()}
        """The windows of the profiled stages (``None`` for the others): a step hook's test."""
        self._worker: WorkerClient | None = None
        self._system: SystemMetrics | None = None
        self.guard = Guard(config.strict, self.turn_off)
        """Runs a hook's body: a failure of ours is one report (:mod:`~neuron_mlflow.engine.
        guard`) and turns profiling off for this front end; training goes on."""

    def prefix(self, stage: str) -> str:
        """The metric prefix ``P`` of ``stage``: ``<metric_prefix>/<stage>``."""
        return f"{self.config.metric_prefix}/{stage}"

    def _stage_windows(self, stage: str) -> StageWindows:
        return StageWindows(self.config, self.prefix(stage), lambda: self._session(stage))

    @property
    def run_id(self) -> str | None:
        return self.options.run_id if self.options is not None else None

    def start(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        run: tuple[str | None, str | None] | None = None,
        broadcast: Broadcast | None = None,
    ) -> None:
        """The framework's loop is set up: this process's options (decided once,
        :meth:`Options.resolve`), the worker started early (it imports MLflow before the first
        window), the system metrics. Call it on every rank, in the front end's guard
        (``broadcast`` is the front end's one collective). Idempotent."""
        if self.options is None:
            self.options = Options.resolve(
                self.config, ranks=self.ranks, rank=rank, world_size=world_size, run=run,
                broadcast=broadcast,
            )  # fmt: skip
        options = self.options
        if options.captures and self._worker is None:
            self._worker = WorkerClient(Path(self.config.local_dir).absolute())
            with contextlib.suppress(Exception):  # early is a bonus: a window starts it too
                self._worker.ensure_running()
        if self._system is None and options.run_id is not None:
            self._system = start_system_metrics(
                self.config, self.backend_name, lambda: options.run_id, options.tracking_uri
            )

    def _session(self, stage: str) -> ProfilingSession | None:
        """The stage's session on a rank that captures (made on its first window step)."""
        options = self.options
        if options is None or stage not in self.stages or self.off or not options.captures:
            return None
        windows = self.windows[stage]
        return ProfilingSession(
            options,
            prefix=self.prefix(stage),
            metric_step=lambda: windows.metric_step,
            skip_windows=windows.done,
        )

    def start_watch(self) -> None:
        """The loop starts (in the front end's guard): capture requests and the slow-step
        trigger, read for the first profiled stage. Start it after the framework took note
        of the signal handlers in place (Lightning puts those back at its end)."""
        windows = self.windows[self.stages[0]]
        options = self.options
        if windows.watch is None and not self.off and options is not None:
            windows.watch = start_for_stage(
                windows, rank=options.rank or 0, world_size=options.world_size or 1,
                run_id=options.run_id, tracking_uri=options.tracking_uri,
            )  # fmt: skip

    def restart(
        self, stage: str, step: int, planned: float | None, detail: str, quiet: bool = True
    ) -> None:
        """A run of ``stage`` starts at ``step`` (:meth:`StageWindows.restart`); on rank 0,
        once per stage, a warning when its schedule cannot complete a window in the
        ``planned`` steps (``detail``: where that number comes from)."""
        windows = self.windows[stage]
        windows.restart(step, quiet)
        message = windows.plan_warning(stage, planned, step, detail)
        if message is None:
            return
        rank = self.options.rank if self.options is not None else rank_and_world_size()[0]
        if rank == 0:
            warnings.warn(f"{self.name}: {message}", NeuronMlflowWarning, stacklevel=2)

    def turn_off(self, exc: BaseException | None = None) -> None:
        """Stop profiling for good in this front end (a failure of ours)."""
        self.off = True
        for windows in self.windows.values():
            if windows.session is not None:
                windows.session.turn_off(exc)

    def end(self, exc: BaseException | None = None) -> None:
        """The framework's loop ended (or raised ``exc``: every open window keeps its capture,
        incomplete): hand what is left to the worker process and stop what was started (the
        sessions, the capture-request watcher and its signal handler, the worker registration,
        the system metrics); a run made for it ends, ``FAILED`` given ``exc``, else
        ``FINISHED``. Nothing waits for the uploads (:meth:`wait` does), except for a window
        asked for on demand whose asker waits for its ``done`` answer (at most
        ``upload_timeout_s``). Idempotent."""
        for windows in self.windows.values():
            if exc is not None:
                self.guard(windows.abort, exc)
            self.guard(windows.close)  # a window still open: partial, to the worker
        for windows in self.windows.values():  # (the watcher is the first stage's)
            watch, windows.watch = windows.watch, None
            if watch is not None:
                if watch.awaiting_windows:  # its last poll answers `done` once uploaded
                    self.wait()
                self.guard(watch.close)
        if self._worker is not None:
            worker, self._worker = self._worker, None
            self.guard(worker.close)
        if self._system is not None:
            system, self._system = self._system, None
            self.guard(system.stop)
        end_run(self.run_id, exc)  # only a run open_run made, once; never raises

    def wait(self, timeout_s: float | None = None) -> bool:
        """See :meth:`AttachedFrontEnd.wait`."""
        timeout = self.config.upload_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        done = True
        for windows in self.windows.values():
            left = max(0.0, deadline - time.monotonic())
            done = bool(Guard(self.config.strict)(windows.wait, left)) and done
        return done


class AttachedFrontEnd:
    """What a framework's front end shows its user, read from its :class:`Attachment`
    (``self.attachment``, made by the front end's constructor with :meth:`_attach`): the
    callbacks of Lightning and Hugging Face share these instead of each forwarding them.
    """

    config: ProfilerConfig
    stages: tuple[str, ...]
    attachment: Attachment

    def _attach(
        self,
        config: ProfilerConfig | None,
        stages: str | Iterable[str],
        ranks: Iterable[int] | None,
        overrides: dict[str, Any],
        all_stages: tuple[str, ...],
    ) -> None:
        """The front end's constructor: ``config`` (default ``ProfilerConfig()``) with the
        ``overrides``, checked, and its :class:`Attachment`."""
        base = config if config is not None else ProfilerConfig()
        self.config = base.with_overrides(**overrides)
        self.attachment = Attachment(
            self.config, stages, ranks, all_stages, name=type(self).__name__
        )
        self.stages = self.attachment.stages
        self.ranks = self.attachment.ranks

    @property
    def summaries(self) -> dict[str, OpSummary]:
        """The last window's op summary of each stage this rank captured."""
        windows = self.attachment.windows.items()
        return {s: w.summary for s, w in windows if w.summary is not None}

    @property
    def run_id(self) -> str | None:
        """The MLflow run windows are logged to (known once the framework's loop is set up)."""
        return self.attachment.run_id

    def prefix(self, stage: str) -> str:
        """The metric prefix ``P`` of ``stage``: ``<metric_prefix>/<stage>``."""
        return self.attachment.prefix(stage)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``, default ``upload_timeout_s``) until the worker process
        has uploaded every window this front end handed it; True when none is left.

        A training call returns without waiting for its windows' uploads (the worker finishes
        them, even after this process ends). Call this before reading the windows back from
        MLflow, or before measuring something else in this process, so that our upload does
        not share the CPU with it. A window the worker could not upload stays in
        ``local_dir`` for ``neuron-mlflow sync`` (reported once, as a warning).
        """
        return self.attachment.wait(timeout_s)

    def state_dict(self) -> dict[str, Any]:
        """Which windows each stage has logged, so a resumed run does not log them again."""
        windows = self.attachment.windows.items()
        return {"version": 1, "done": {s: sorted(w.done) for s, w in windows}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (missing keys read as defaults)."""
        windows = self.attachment.windows
        for stage, done in state_dict.get("done", {}).items():
            if stage in windows:
                windows[stage].done.update(int(i) for i in done)
