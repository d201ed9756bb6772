"""The Lightning front end: :class:`NeuronProfilerCallback`.

Lightning's hooks over the engine's :class:`~neuron_mlflow.engine.attach.Attachment`: the
train stage's hooks are written out (every training step runs two of them); those of the
evaluation stages are made from their rows of the stage table
(:mod:`neuron_mlflow.integrations.stage_table`). No hook waits for a summary, an upload or
another rank.
Only this module imports ``lightning``.

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

from collections.abc import Callable, Iterable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.attach import AttachedFrontEnd
from neuron_mlflow.integrations.stage_table import STAGE_HOOKS, STAGES, StageHooks


class NeuronProfilerCallback(AttachedFrontEnd, Callback):
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

    A ``train`` step is one optimizer step, numbered by ``trainer.global_step``; the other
    stages count batches from 0 in each run of the stage. ``fit``, ``validate``, ``test`` and
    ``predict`` return without waiting for the uploads (:meth:`wait` waits). The rest (metric
    steps, the run, ranks, checkpoint state): docs/lightning.md. See the module docstring for
    an example.
    """

    def __init__(
        self,
        config: ProfilerConfig | None = None,
        stages: str | Iterable[str] = ("train",),
        ranks: Iterable[int] | None = None,
        **overrides: Any,
    ) -> None:
        self._attach(config, stages, ranks, overrides, STAGES)
        self._windows = self.attachment.windows
        self._profiled = self.attachment.profiled
        self._guard = self.attachment.guard
        self._optimizer_steps = 0
        self._automatic = True  # the module's automatic_optimization, read at train start

    @property
    def state_key(self) -> str:
        """Key of this callback's checkpoint state: the class, the stages and the schedule."""
        return self._generate_state_key(stages=self.stages, schedule=self.config.schedule)

    # -- Lightning hooks: run and ranks -------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._guard(self._setup, trainer)

    def _setup(self, trainer: Trainer) -> None:
        run = None  # the MLFlowLogger's run, on rank 0 (else the active run, else a new run)
        if trainer.is_global_zero and self.attachment.options is None:
            for logger in trainer.loggers:
                if isinstance(logger, MLFlowLogger):
                    run = (logger.experiment.tracking_uri, logger.run_id)
                    break
        self.attachment.start(
            rank=trainer.global_rank, world_size=trainer.world_size, run=run,
            broadcast=lambda value: trainer.strategy.broadcast(value, src=0),
        )  # fmt: skip

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        self._optimizer_steps += 1  # (cheaper than reading trainer.global_step at each batch)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self.attachment.end(exception)  # Lightning calls no teardown hook after an exception

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.attachment.end()

    # -- Lightning hooks: the steps of each stage (rows of the stage table) --------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._automatic = bool(pl_module.automatic_optimization)
        self._guard(self._stage_start, trainer, _TRAIN)

    # The train row's step hooks, written out (every training step runs them): outside a
    # window, outside the guard (StageWindows.begin_quiet / end_quiet never raise).

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
            self._guard(windows.begin, windows.next_step, "train_step")

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

    # -- the step functions the stages' start and end hooks call ---------------------------

    def _stage_start(self, trainer: Trainer, spec: StageHooks) -> None:
        self.attachment.start_watch()
        if trainer.sanity_checking or spec.stage not in self.stages:
            return
        planned = getattr(trainer, spec.planned)
        if spec is _TRAIN:  # optimizer steps, numbered by global_step; else batches from 0
            self._optimizer_steps = 0
            detail = (
                f"max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs}, "
                f"accumulate_grad_batches={trainer.accumulate_grad_batches}"
            )
            self.attachment.restart(spec.stage, trainer.global_step, planned, detail, quiet=False)
        else:
            detail = f"{spec.planned}={planned}"
            planned = sum(planned) if isinstance(planned, list) else planned
            self.attachment.restart(spec.stage, 0, planned, detail)

    def _stage_end(self, trainer: Trainer, spec: StageHooks) -> None:
        if trainer.sanity_checking or spec.stage not in self.stages:
            return
        self._windows[spec.stage].finish()


def _evaluation_hooks(row: StageHooks) -> dict[str, Callable[..., None]]:
    """The four hooks of an evaluation stage's row: one step per batch. As the train row's,
    the guard runs only for a step in or next to a window."""
    stage, step_name = row.stage, f"{row.stage}_step"  # (neuron_mlflow: validate_step)

    def start(self: NeuronProfilerCallback, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_start, trainer, row)

    def batch_start(
        self: NeuronProfilerCallback,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        windows = self._profiled[stage]
        if windows is None or trainer.sanity_checking:  # (the sanity check: never profiled)
            return
        if not windows.begin_quiet(windows.next_step):
            self._guard(windows.begin, windows.next_step, step_name)

    def batch_end(
        self: NeuronProfilerCallback,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        windows = self._windows[stage]
        if windows.open_step is not None:  # begun (so a chosen stage, not a sanity check)
            if not windows.end_quiet():
                self._guard(windows.end, batch_idx)
            windows.next_step += 1

    def end(self: NeuronProfilerCallback, trainer: Trainer, pl_module: LightningModule) -> None:
        self._guard(self._stage_end, trainer, row)

    return {row.start: start, row.batch_start: batch_start, row.batch_end: batch_end, row.end: end}


_TRAIN = STAGE_HOOKS[0]
for _row in STAGE_HOOKS[1:]:  # validate, test, predict: their hooks, made from their rows
    for _name, _hook in _evaluation_hooks(_row).items():
        setattr(NeuronProfilerCallback, _name, _hook)
