"""The Lightning front end: :class:`NeuronProfilerCallback`.

A thin callback over the engine: it says when a step begins and ends in each stage, which run
to use, and which ranks capture. Window bookkeeping and per-rank gathering are the engine's
(:class:`~neuron_mlflow.engine.stages.StageWindows`). The hooks are plain methods: each stage's
four hooks call one of four step functions with its row of the stage table
(:mod:`neuron_mlflow.integrations.stage_table`); the train row's two step hooks, which every
training step runs, are written out. No hook waits for a summary, an upload or
another rank, and a step that cannot touch a window costs a few attribute reads and one
comparison. The end of a Trainer call (``teardown``, or ``on_exception``) hands what is left
to the worker process and stops what the callback started; :meth:`NeuronProfilerCallback.wait`
waits for the uploads. Only this module imports ``lightning``.

Example:
    >>> import tempfile, torch
    >>> from lightning.pytorch import Trainer
    >>> from lightning.pytorch.demos.boring_classes import BoringModel
    >>> import neuron_mlflow as nm
    >>> callback = nm.NeuronProfilerCallback(schedule=nm.Schedule(warmup=1, active=2),
    ...                                      backend="cpu", local_dir=tempfile.mkdtemp())
    >>> trainer = Trainer(max_steps=4, callbacks=[callback], logger=False,
    ...                   enable_checkpointing=False, enable_progress_bar=False,
    ...                   enable_model_summary=False, limit_val_batches=0)
    >>> trainer.fit(BoringModel())
    >>> callback.summaries["train"].steps
    2
    >>> callback.wait()  # the window in MLflow (fit returned without waiting for it)
    True
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_warn

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.capture_requests import start_for_stage
from neuron_mlflow.engine.guard import Guard
from neuron_mlflow.engine.runs import open_run
from neuron_mlflow.engine.session import ProfilingSession
from neuron_mlflow.engine.stages import StageWindows, check_ranks
from neuron_mlflow.engine.system_metrics import SystemMetrics, start_system_metrics
from neuron_mlflow.engine.worker import WorkerClient
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.integrations.stage_table import STAGES, StageHooks, check_stages, hooks_of
from neuron_mlflow.summary.ops import OpSummary


class NeuronProfilerCallback(Callback):
    """Profile Lightning train/validate/test/predict steps into the trainer's MLflow run.

    Args:
        config: base configuration; defaults to ``ProfilerConfig()`` (environment, YAML file).
        stages: which of ``train``, ``validate``, ``test``, ``predict`` to profile; each has
            its own step counter and schedule, and metric prefix ``<metric_prefix>/<stage>``.
        ranks: global ranks that capture (default: all).
        **overrides: ``ProfilerConfig`` fields overriding ``config``.

    Raises:
        ConfigError: a bad stage, rank or config value (the message lists what is allowed).
        BackendUnavailableError: the backend cannot run here.

    A ``train`` step is one optimizer step (gradient accumulation counts once), numbered by
    ``trainer.global_step``; its metric step is ``trainer.global_step`` when the window is
    logged. Other stages count batches from 0 in each run of the stage; their metric step is
    the batch index of the window's last step. The sanity-check validation is never profiled.
    The checkpoint state (windows already logged) is saved under :attr:`state_key`, which
    includes the stages and the schedule: callbacks with other stages keep their own state.

    ``fit``, ``validate``, ``test`` and ``predict`` return when their steps end: the windows
    are summarised and uploaded by a worker process that finishes them even after this
    process ends. Call :meth:`wait` to have them in MLflow before going on (to read them back,
    or before measuring something else on this host). After each Trainer call, and after one
    that raised, nothing of the callback runs in this process: no thread, no signal handler.
    """

    def __init__(
        self,
        config: ProfilerConfig | None = None,
        stages: str | Iterable[str] = ("train",),
        ranks: Iterable[int] | None = None,
        **overrides: Any,
    ) -> None:
        base = config if config is not None else ProfilerConfig()
        self.config = base.with_overrides(**overrides)
        self.stages = check_stages(stages)
        self.ranks = check_ranks(ranks)
        backend = resolve_backend(self.config.backend, self.config)  # fail now, not mid-fit
        self._backend_name = backend.name
        self._system: SystemMetrics | None = None  # neuron-monitor, for the whole fit
        self._run: tuple[str | None, str | None] | None = None
        self._trainer: Trainer | None = None
        self._off = False  # a failure of ours turned profiling off for this callback
        self._job_id: str | None = None
        self._windows = {stage: self._stage_windows(stage) for stage in STAGES}
        self._profiled = {s: w if s in self.stages else None for s, w in self._windows.items()}
        self._optimizer_steps = 0
        self._automatic = True  # the module's automatic_optimization, read at train start
        self._worker: WorkerClient | None = None
        self._guard = Guard(self.config.strict, self._turn_off)
        """Runs a hook's body: a failure of ours is one report (:mod:`~neuron_mlflow.engine.
        guard`) and turns profiling off for this callback; training goes on."""

    def _stage_windows(self, stage: str) -> StageWindows:
        return StageWindows(self.config, self.prefix(stage), lambda: self._session(stage))

    @property
    def state_key(self) -> str:
        """Key of this callback's checkpoint state: the class, the stages and the schedule."""
        return self._generate_state_key(stages=self.stages, schedule=self.config.schedule)

    @property
    def summaries(self) -> dict[str, OpSummary]:
        """The last window's op summary of each stage this rank captured."""
        return {s: w.summary for s, w in self._windows.items() if w.summary is not None}

    # -- run, ranks, sessions -----------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run windows are logged to (known after ``setup``)."""
        return self._run[1] if self._run else None

    def prefix(self, stage: str) -> str:
        """The metric prefix ``P`` of ``stage``: ``<metric_prefix>/<stage>``."""
        return f"{self.config.metric_prefix}/{stage}"

    def _resolve_run(self, trainer: Trainer) -> tuple[str | None, str | None]:
        """On rank 0: the MLFlowLogger's run, else the active run, else a new run."""
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                return logger.experiment.tracking_uri, logger.run_id
        return open_run(self.config)

    def _session(self, stage: str) -> ProfilingSession | None:
        """The stage's session on a rank that captures (made on its first window step)."""
        trainer = self._trainer
        if trainer is None or stage not in self.stages or self._off:
            return None
        if self.ranks is not None and trainer.global_rank not in self.ranks:
            return None
        uri, run_id = self._run or (None, None)
        rank0 = trainer.global_rank == 0
        windows = self._windows[stage]
        return ProfilingSession(
            self.config,
            prefix=self.prefix(stage),
            run_id=run_id,
            tracking_uri=uri,
            upload=run_id is not None or rank0,
            rank=(trainer.global_rank, trainer.world_size),
            metric_step=lambda: windows.metric_step,
            skip_windows=windows.done,
            traces_only=not rank0,
            follow_active_run=False,
            job_id=self._job_id,
            system_metrics=False,
            capture_ranks=tuple(sorted(self.ranks)) if self.ranks is not None else None,
            rank_metrics=True,
            on_demand=False,  # the stage's own watcher (setup) reads requests
        )

    # -- the guard ----------------------------------------------------------------------

    def _turn_off(self, exc: BaseException | None = None) -> None:
        self._off = True
        for windows in self._windows.values():
            if windows.session is not None:
                windows.session._turn_off(exc)

    # -- Lightning hooks: run and ranks -------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._guard(self._setup, trainer)

    def _setup(self, trainer: Trainer) -> None:
        if self._job_id is None:  # decided once by rank 0: one run per job, even offline
            self._job_id = trainer.strategy.broadcast(
                uuid.uuid4().hex if trainer.is_global_zero else None, src=0
            )
        if self._run is None:
            payload = self._resolve_run(trainer) if trainer.is_global_zero else None
            self._run = trainer.strategy.broadcast(payload, src=0)
        captures = self.ranks is None or trainer.global_rank in self.ranks
        if captures and self._worker is None:  # it imports MLflow before the first window
            self._worker = WorkerClient(Path(self.config.local_dir).absolute())
            with contextlib.suppress(Exception):  # early is a bonus: a window starts it too
                self._worker.ensure_running()
        if self._system is None and self._run is not None and self._run[1] is not None:
            uri, run_id = self._run
            self._system = start_system_metrics(
                self.config, self._backend_name, lambda: run_id, uri
            )

    def _start_watch(self, trainer: Trainer) -> None:
        """Capture requests and the slow-step trigger, read for the first chosen stage: started
        when the Trainer's loop starts, after Lightning took note of the signal handlers in
        place (it puts those back at its end, even after an exception, when no hook of ours
        runs any more: the capture signal's handler must not be among them)."""
        windows = self._windows[self.stages[0]]
        if windows.watch is None and not self._off:
            uri, run_id = self._run or (None, None)
            windows.watch = start_for_stage(
                windows, rank=trainer.global_rank, world_size=trainer.world_size,
                run_id=run_id, tracking_uri=uri,
            )  # fmt: skip

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        # Optimizer steps are counted here, not read back from trainer.global_step at every
        # batch: that keeps the hooks cheap outside a window.
        self._optimizer_steps += 1

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        for windows in self._windows.values():
            self._guard(windows.abort, exception)  # keeps the capture (incomplete)
        self._end()  # Lightning calls no teardown hook after an exception

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._end()

    def _end(self) -> None:
        """The end of a Trainer call: hand what is left to the worker process and stop what
        this callback started (the sessions, the capture-request watcher and its signal
        handler, the worker registration, the system metrics). Nothing waits for the
        uploads (:meth:`wait` does), except for a window asked for on demand whose asker
        waits for its ``done`` answer (at most ``upload_timeout_s``). Idempotent."""
        for windows in self._windows.values():
            self._guard(windows.close)  # a window still open: partial, to the worker
        for windows in self._windows.values():  # (the watcher is the first stage's)
            watch, windows.watch = windows.watch, None
            if watch is not None:
                if watch.awaiting_windows:  # its last poll answers `done` once uploaded
                    self.wait()
                self._guard(watch.close)
        if self._worker is not None:
            worker, self._worker = self._worker, None
            self._guard(worker.close)
        if self._system is not None:
            system, self._system = self._system, None
            self._guard(system.stop)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``, default ``upload_timeout_s``) until the worker process
        has uploaded every window this callback handed it; True when none is left.

        A Trainer call returns without waiting for its windows' uploads (the worker finishes
        them, even after this process ends). Call this before reading the windows back from
        MLflow, or before measuring something else in this process, so that our upload does
        not share the CPU with it. A window the worker could not upload stays in
        ``local_dir`` for ``neuron-mlflow sync`` (reported once, as a warning).
        """
        timeout = self.config.upload_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        done = True
        for windows in self._windows.values():
            left = max(0.0, deadline - time.monotonic())
            done = bool(Guard(self.config.strict)(windows.wait, left)) and done
        return done

    def state_dict(self) -> dict[str, Any]:
        """Which windows each stage has logged, so a resumed run does not log them again."""
        return {"version": 1, "done": {s: sorted(w.done) for s, w in self._windows.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (missing keys read as defaults)."""
        for stage, done in state_dict.get("done", {}).items():
            if stage in self._windows:
                self._windows[stage].done.update(int(i) for i in done)

    # -- Lightning hooks: the steps of each stage (rows of the stage table) --------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._automatic = bool(pl_module.automatic_optimization)
        self._guard(self._stage_start, trainer, _TRAIN)

    # The train row's two step hooks are written out: every training step runs them. Outside
    # a window each is a few attribute reads, a counter and one comparison, outside the guard
    # (StageWindows.begin_quiet / end_quiet never raise).

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        windows = self._profiled["train"]
        # with accumulation, the first micro-batch begins a step (open_step is then set)
        if (
            windows is not None
            and windows.open_step is None
            and not windows.begin_quiet(windows.next_step)
        ):
            # marked until the step ends (neuron_mlflow: train_step): validation,
            # checkpoints and the loop's own work between steps are not summarised
            self._guard(windows.begin, windows.next_step, _TRAIN.step_name)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        steps = self._optimizer_steps
        if steps:  # the optimizer stepped: this batch ends a train step (accumulation: not yet)
            self._optimizer_steps = 0
            windows = self._windows["train"]
            # automatic: += the optimizer steps (= trainer.global_step); manual: one step per
            # batch, however many optimizers stepped in it (global_step counts each one)
            windows.next_step += steps if self._automatic else 1
            if not windows.end_quiet():
                self._guard(windows.end, windows.next_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_end, trainer, _TRAIN)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_start, trainer, _VALIDATE)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_start(trainer, _VALIDATE)

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_end(trainer, _VALIDATE, batch_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_end, trainer, _VALIDATE)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_start, trainer, _TEST)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_start(trainer, _TEST)

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_end(trainer, _TEST, batch_idx)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_end, trainer, _TEST)

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_start, trainer, _PREDICT)

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_start(trainer, _PREDICT)

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._batch_end(trainer, _PREDICT, batch_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_end, trainer, _PREDICT)

    # -- the step functions the hooks call ------------------------------------------------

    def _stage_start(self, trainer: Trainer, spec: StageHooks) -> None:
        self._start_watch(trainer)
        if trainer.sanity_checking or spec.stage not in self.stages:
            return
        windows = self._windows[spec.stage]
        planned = getattr(trainer, spec.planned)
        if spec.optimizer_steps:
            self._optimizer_steps = 0
            windows.restart(trainer.global_step, quiet=False)
            detail = (
                f"max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs}, "
                f"accumulate_grad_batches={trainer.accumulate_grad_batches}"
            )
        else:
            windows.restart(0)
            detail = f"{spec.planned}={planned}"
            planned = sum(planned) if isinstance(planned, list) else planned
        message = windows.plan_warning(spec.stage, planned, windows.next_step, detail)
        if message is not None:
            rank_zero_warn(f"NeuronProfilerCallback: {message}", category=NeuronMlflowWarning)

    # The evaluation stages' steps (one per batch): as the train row's, the guard runs only
    # for a step in or next to a window.

    def _batch_start(self, trainer: Trainer, spec: StageHooks) -> None:
        windows = self._profiled[spec.stage]
        if windows is None or trainer.sanity_checking:  # (the sanity check: never profiled)
            return
        if not windows.begin_quiet(windows.next_step):
            self._guard(windows.begin, windows.next_step, spec.step_name)

    def _batch_end(self, trainer: Trainer, spec: StageHooks, batch_idx: int) -> None:
        windows = self._windows[spec.stage]
        if windows.open_step is not None:  # begun (so a chosen stage, not a sanity check)
            if not windows.end_quiet():
                self._guard(windows.end, batch_idx)
            windows.next_step += 1

    def _stage_end(self, trainer: Trainer, spec: StageHooks) -> None:
        if trainer.sanity_checking or spec.stage not in self.stages:
            return
        windows = self._windows[spec.stage]
        last = windows.open_step if windows.open_step is not None else windows.next_step - 1
        windows.finish(last)


_TRAIN, _VALIDATE, _TEST, _PREDICT = (hooks_of(stage) for stage in STAGES)
