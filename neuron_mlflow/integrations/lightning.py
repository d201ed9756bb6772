"""The Lightning front end: :class:`NeuronProfilerCallback`.

A thin callback over the engine (:class:`~neuron_mlflow.engine.session.ProfilingSession`): it says
when a step begins and ends, which run to use, and which ranks capture. Only this module
imports ``lightning``.

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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_warn

from neuron_mlflow.capture.backends import resolve_backend
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.session import ProfilingSession
from neuron_mlflow.errors import ConfigError, NeuronMlflowWarning
from neuron_mlflow.naming import metric_key
from neuron_mlflow.schedule import Action, action_at, next_window_start, window_at
from neuron_mlflow.summary.ops import OpSummary

STAGES = ("train", "validate", "test", "predict")
"""Stages the callback can profile."""


def _check_stages(stages: str | Iterable[str]) -> tuple[str, ...]:
    chosen = (stages,) if isinstance(stages, str) else tuple(stages)
    bad = [s for s in chosen if s not in STAGES]
    if bad or not chosen:
        raise ConfigError(
            f"invalid stages {chosen!r}: {'unknown ' + repr(bad) if bad else 'none given'}; "
            f"allowed: {', '.join(STAGES)}"
        )
    return tuple(dict.fromkeys(chosen))


def _check_ranks(ranks: Iterable[int] | None) -> frozenset[int] | None:
    if ranks is None:
        return None
    chosen = tuple(ranks)
    bad = [r for r in chosen if not isinstance(r, int) or isinstance(r, bool) or r < 0]
    if bad or not chosen:
        raise ConfigError(
            f"invalid ranks {chosen!r}: expected global ranks as integers >= 0 "
            "(or None for all ranks)"
        )
    return frozenset(chosen)


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
        self.stages = _check_stages(stages)
        self.ranks = _check_ranks(ranks)
        resolve_backend(self.config.backend, self.config)  # fail at construction, not mid-training
        self.summaries: dict[str, OpSummary] = {}
        self._done: dict[str, set[int]] = {stage: set() for stage in STAGES}
        self._sessions: dict[str, ProfilingSession] = {}
        self._run: tuple[str | None, str | None] | None = None
        self._counters: dict[str, int] = dict.fromkeys(STAGES, 0)
        self._open_step: dict[str, int | None] = dict.fromkeys(STAGES, None)
        self._metric_steps: dict[str, int] = dict.fromkeys(STAGES, 0)
        # Steps before this one cannot touch a window: the hooks return at once (fast path).
        first = next_window_start(self.config.schedule, 0)
        self._quiet_until: dict[str, float] = dict.fromkeys(
            STAGES, math.inf if first is None else first
        )
        self._checked: set[str] = set()
        self._train_step = 0
        self._optimizer_steps = 0

    # -- run and sessions ---------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run windows are logged to (known after ``setup``)."""
        return self._run[1] if self._run else None

    def prefix(self, stage: str) -> str:
        """The metric prefix ``P`` of ``stage``: ``<metric_prefix>/<stage>``."""
        return f"{self.config.metric_prefix}/{stage}"

    def _resolve_run(self, trainer: Trainer) -> tuple[str | None, str | None]:
        """On rank 0: the MLFlowLogger's run, else the active run, else a new run."""
        import mlflow

        from neuron_mlflow.sinks.mlflow_sink import MlflowSink

        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                return logger.experiment.tracking_uri, logger.run_id
        active = mlflow.active_run()
        if active is not None:
            return mlflow.get_tracking_uri(), active.info.run_id
        sink = MlflowSink()
        try:
            sink.check_reachable()
            return sink.tracking_uri, sink.create_run(
                self.config.experiment_name, self.config.run_name
            )
        except Exception as exc:
            if self.config.strict:
                raise
            warnings.warn(
                f"neuron-mlflow: could not create an MLflow run at {sink.tracking_uri} "
                f"({type(exc).__name__}: {exc}); windows stay in {self.config.local_dir} "
                "(pending) for `neuron-mlflow sync`",
                NeuronMlflowWarning,
                stacklevel=2,
            )
            return sink.tracking_uri, None

    def _captures(self, trainer: Trainer) -> bool:
        return self.ranks is None or trainer.global_rank in self.ranks

    def _session(self, trainer: Trainer, stage: str) -> ProfilingSession | None:
        if stage not in self.stages or not self._captures(trainer):
            return None
        session = self._sessions.get(stage)
        if session is None:
            uri, run_id = self._run or (None, None)
            rank0 = trainer.global_rank == 0
            session = ProfilingSession(
                self.config,
                prefix=self.prefix(stage),
                run_id=run_id,
                tracking_uri=uri,
                upload=run_id is not None or rank0,
                rank=(trainer.global_rank, trainer.world_size),
                metric_step=lambda: self._metric_steps[stage],
                skip_windows=self._done[stage],
                traces_only=not rank0,
                follow_active_run=False,
            )
            self._sessions[stage] = session
        return session

    # -- steps --------------------------------------------------------------------------

    def _begin(self, trainer: Trainer, stage: str, step: int) -> None:
        self._open_step[stage] = step
        if step < self._quiet_until[stage]:
            return
        session = self._session(trainer, stage)
        if session is not None:
            session.seek(step)
            session.begin_step()

    def _end(self, trainer: Trainer, stage: str, metric_step: int) -> None:
        step = self._open_step[stage]
        if step is None:
            return
        self._open_step[stage] = None
        if step < self._quiet_until[stage]:
            return
        self._metric_steps[stage] = metric_step
        session = self._sessions.get(stage)
        if session is not None:
            session.end_step()
        schedule = self.config.schedule
        window = window_at(schedule, step)
        if window is None or step == window.last:
            following = next_window_start(schedule, step + 1)
            self._quiet_until[stage] = math.inf if following is None else following
        if window is not None and action_at(schedule, step) == Action.RECORD_AND_SAVE:
            self._window_ended(trainer, stage, window.index)

    def _stage_end(self, trainer: Trainer, stage: str, last_step: int | None) -> None:
        """Log a window cut short by the end of the stage (partial)."""
        if stage not in self.stages or last_step is None:
            return
        window = window_at(self.config.schedule, last_step)
        if window is None or last_step < window.first or window.index in self._done[stage]:
            return
        session = self._sessions.get(stage)
        if session is not None:
            session.flush()
        self._window_ended(trainer, stage, window.index)

    def _window_ended(self, trainer: Trainer, stage: str, index: int) -> None:
        """Every rank: mark the window done, gather per-rank times, rank 0 logs them."""
        if index in self._done[stage]:
            return
        session = self._sessions.get(stage)
        summary = session.summary if session is not None else None
        fresh = summary is not None and session is not None and session.records
        fresh = fresh and session.records[-1].manifest["window"]["index"] == index
        values = torch.full((3,), math.nan, dtype=torch.float64)
        if fresh and summary is not None:
            self.summaries[stage] = summary
            has_device = summary.device_time_us is not None
            values[0] = summary.device_time_us if has_device else summary.cpu_time_us
            values[1] = summary.wall_time_us
            values[2] = 1.0 if has_device else 0.0
        self._done[stage].add(index)
        gathered = trainer.strategy.all_gather(values).reshape(-1, 3)
        if trainer.is_global_zero:
            self._log_rank_metrics(stage, gathered)

    def _log_rank_metrics(self, stage: str, gathered: torch.Tensor) -> None:
        run_id = self.run_id or (self._sessions[stage].run_id if stage in self._sessions else None)
        if run_id is None:
            return
        metrics: dict[str, float] = {}
        for rank, (time_us, wall_us, has_device) in enumerate(gathered.tolist()):
            if math.isnan(time_us):
                continue
            name = "device_time_us" if has_device == 1.0 else "cpu_time_us"
            metrics[metric_key(self.prefix(stage), "rank", str(rank), name)] = time_us
            metrics[metric_key(self.prefix(stage), "rank", str(rank), "wall_time_us")] = wall_us
        if not metrics:
            return
        try:
            import time

            from mlflow.entities import Metric

            from neuron_mlflow.sinks.mlflow_sink import MlflowSink

            step = self._metric_steps[stage]
            now = int(time.time() * 1000)
            MlflowSink(self._run[0] if self._run else None).client.log_batch(
                run_id,
                metrics=[Metric(k, v, now, step) for k, v in metrics.items()],
                synchronous=True,
            )
        except Exception as exc:
            if self.config.strict:
                raise
            warnings.warn(
                f"neuron-mlflow: could not log per-rank metrics ({type(exc).__name__}: {exc})",
                NeuronMlflowWarning,
                stacklevel=2,
            )

    def _check_plan(self, stage: str, planned: float, start: int, detail: str) -> None:
        """Warn once when the stage's schedule can never complete a window."""
        if stage not in self.stages or stage in self._checked:
            return
        self._checked.add(stage)
        if planned is None or math.isinf(planned):
            return
        schedule = self.config.schedule
        first = next_window_start(schedule, start)
        window = window_at(schedule, first) if first is not None else None
        if window is None or window.last >= planned:
            needed = "no window left" if window is None else f"steps up to {window.last}"
            rank_zero_warn(
                f"NeuronProfilerCallback: the {stage!r} schedule (skip_first="
                f"{schedule.skip_first}, wait={schedule.wait}, warmup={schedule.warmup}, "
                f"active={schedule.active}, repeat={schedule.repeat}) needs {needed} to "
                f"complete a window, but the stage plans {int(planned)} steps ({detail}); "
                "a window cut short is logged as partial, one that never starts is not logged",
                category=NeuronMlflowWarning,
            )

    # -- Lightning hooks ----------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._run is None:
            payload = self._resolve_run(trainer) if trainer.is_global_zero else None
            self._run = trainer.strategy.broadcast(payload, src=0)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Optimizer steps are counted here (on_before_optimizer_step), not read back from
        # trainer.global_step at every batch: that keeps the hooks cheap outside a window.
        self._train_step = trainer.global_step
        self._optimizer_steps = 0
        self._check_plan(
            "train",
            trainer.estimated_stepping_batches,
            trainer.global_step,
            f"max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs}, "
            f"accumulate_grad_batches={trainer.accumulate_grad_batches}",
        )

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._open_step["train"] is None and "train" in self.stages:
            self._begin(trainer, "train", self._train_step)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        self._optimizer_steps += 1

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._optimizer_steps:  # the optimizer stepped: this batch ends a train step
            self._train_step += self._optimizer_steps
            self._optimizer_steps = 0
            self._end(trainer, "train", self._train_step)  # = trainer.global_step

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        open_step = self._open_step["train"]
        self._open_step["train"] = None
        last = open_step if open_step is not None else trainer.global_step - 1
        self._stage_end(trainer, "train", last if last >= 0 else None)

    def _eval_batch_start(self, trainer: Trainer, stage: str) -> None:
        if stage in self.stages and not trainer.sanity_checking:
            self._begin(trainer, stage, self._counters[stage])

    def _eval_batch_end(self, trainer: Trainer, stage: str, batch_idx: int) -> None:
        if self._open_step[stage] is not None:  # begun (so not a sanity check)
            self._end(trainer, stage, batch_idx)
            self._counters[stage] += 1

    def _eval_start(self, trainer: Trainer, stage: str, batches: Any, name: str) -> None:
        if trainer.sanity_checking:
            return
        self._counters[stage] = 0
        first = next_window_start(self.config.schedule, 0)
        self._quiet_until[stage] = math.inf if first is None else first
        total = sum(batches) if isinstance(batches, list) else batches
        self._check_plan(stage, total, 0, f"{name}={batches}")

    def _eval_end(self, trainer: Trainer, stage: str) -> None:
        if stage in self.stages and not trainer.sanity_checking:
            count = self._counters[stage]
            self._stage_end(trainer, stage, count - 1 if count else None)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "validate", trainer.num_val_batches, "num_val_batches")

    def on_validation_batch_start(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_start(trainer, "validate")

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, "validate", batch_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "validate")

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "test", trainer.num_test_batches, "num_test_batches")

    def on_test_batch_start(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_start(trainer, "test")

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, "test", batch_idx)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "test")

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "predict", trainer.num_predict_batches, "num_predict_batches")

    def on_predict_batch_start(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_start(trainer, "predict")

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, "predict", batch_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "predict")

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        for stage, session in self._sessions.items():
            if session.window_open:
                session.abort(exception)  # never raises; keeps the capture (incomplete)
            self._open_step[stage] = None

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()

    def state_dict(self) -> dict[str, Any]:
        """Which windows each stage has logged, so a resumed run does not log them again."""
        return {"version": 1, "done": {s: sorted(done) for s, done in self._done.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (missing keys read as defaults)."""
        for stage, done in state_dict.get("done", {}).items():
            if stage in self._done:
                self._done[stage].update(int(i) for i in done)
