"""The Hugging Face front end: :class:`HfProfilerCallback`, a ``transformers.TrainerCallback``.

Its hooks over the engine's :class:`~neuron_mlflow.engine.attach.Attachment`, as the
Lightning callback's. It uses only the ``TrainerCallback`` API, so that a trainer calling the
same hooks (optimum-neuron's ``NeuronTrainer``) works too; no hook waits for a summary, an
upload or another rank. Only this module imports ``transformers``; docs/transformers.md.

Example:
    >>> import tempfile, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    >>> import neuron_mlflow as nm
    >>> callback = nm.HfProfilerCallback(schedule=nm.Schedule(warmup=1, active=2),
    ...                                  backend="cpu", local_dir=tempfile.mkdtemp())
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
    ...                                    n_positions=16, bos_token_id=0, eos_token_id=0))
    >>> data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))}
    ...         for _ in range(8)]
    >>> args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, use_cpu=True,
    ...                          report_to=[], save_strategy="no", disable_tqdm=True)
    >>> trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    >>> _ = trainer.train()  # doctest: +ELLIPSIS
    {'train_runtime': ...}
    >>> callback.summaries["train"].steps
    2
    >>> callback.wait()  # the window in MLflow (train() returned without waiting for it)
    True
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import weakref
from collections.abc import Iterable
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.attach import AttachedFrontEnd
from neuron_mlflow.engine.stages import StageWindows
from neuron_mlflow.errors import NeuronMlflowError

STAGES = ("train", "evaluate")
"""Stages the callback can profile: optimizer steps, and the evaluation loop's batches."""

_unended: weakref.WeakSet[HfProfilerCallback] = weakref.WeakSet()
"""Callbacks inside a ``train()`` (or an evaluation) that has not ended: one that raised."""


class HfProfilerCallback(AttachedFrontEnd, TrainerCallback):
    """Profile a Hugging Face ``Trainer``'s optimizer steps into its MLflow run.

    Args:
        config: base configuration; defaults to ``ProfilerConfig()`` (environment, YAML file).
        stages: ``train`` (optimizer steps) and/or ``evaluate`` (the evaluation loop's
            batches); each has its own step counter and schedule, and metric prefix
            ``<metric_prefix>/<stage>``.
        ranks: global ranks that capture (default: all).
        **overrides: ``ProfilerConfig`` fields overriding ``config``.

    Raises:
        ConfigError: a bad stage, rank or config value (the message lists what is allowed).
        BackendUnavailableError: the backend cannot run here.

    A ``train`` step is one optimizer step (``on_step_begin`` to ``on_step_end``), an
    ``evaluate`` step one batch of the evaluation loop; windows go into the run of
    Transformers' ``MLflowCallback`` when the Trainer has one. ``train()`` returns without
    waiting for the uploads (:meth:`wait` waits); Transformers calls no callback when it
    raises: :meth:`close` then stops what the callback started. The rest (step numbers, the
    run, ranks, failures): docs/transformers.md. See the module docstring for an example.
    """

    def __init__(
        self,
        config: ProfilerConfig | None = None,
        stages: str | Iterable[str] = ("train",),
        ranks: Iterable[int] | None = None,
        **overrides: Any,
    ) -> None:
        self._attach(config, stages, ranks, overrides, STAGES)
        self._guard = self.attachment.guard
        # the step hooks' test: the stage's windows when it is profiled, else None
        self._train: StageWindows | None = self.attachment.profiled["train"]
        self._evaluate: StageWindows | None = self.attachment.profiled["evaluate"]
        self._training = False  # inside train() (on_train_begin seen, on_train_end not yet)
        self._evaluating = False  # an evaluation loop's first batch seen, its end not yet

    def close(self) -> None:
        """Stop what the callback started after a ``train()`` (or evaluation) that raised,
        as Transformers calls no callback then; the open window is kept (incomplete).
        Idempotent; the next ``train()`` and the process's exit do it too."""
        self._end(_Unended("train() or an evaluation did not reach its end"))

    def _end(self, exc: BaseException | None = None) -> None:
        unended = self._training or self._evaluating
        self._training = self._evaluating = False
        _unended.discard(self)
        self.attachment.end(exc if unended else None)

    # -- training ------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._training or self._evaluating:  # an earlier train() raised
            self.close()
        self._training = True
        _unended.add(self)
        self._guard(self._begin_training, args, state, kwargs.get("model"), sys._getframe(1))

    def _begin_training(
        self, args: TrainingArguments, state: TrainerState, model: Any, caller: FrameType
    ) -> None:
        self._start(args, state, model, caller)
        if self._train is not None:
            detail = (
                f"max_steps={state.max_steps}, "
                f"gradient_accumulation_steps={args.gradient_accumulation_steps}"
            )
            self.attachment.restart("train", state.global_step, state.max_steps, detail, False)

    # The two step hooks every optimizer step runs: outside a window a few attribute reads and
    # one comparison, outside the guard (StageWindows.begin_quiet / end_quiet never raise).

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        windows = self._train
        # (a trainer that calls it for every micro-batch: the first one begins the step)
        if windows is not None and windows.open_step is None:
            step = state.global_step
            if not windows.begin_quiet(step):
                # marked until the step ends (neuron_mlflow: train_step): evaluation,
                # checkpoints and the loop's own work between steps are not summarised
                self._guard(windows.begin, step, "train_step")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        windows = self._train
        if windows is not None:
            windows.next_step = state.global_step  # the heartbeat's step (`capture` reads it)
            if not windows.end_quiet():
                self._guard(windows.end, state.global_step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        windows = self._train
        if windows is not None:
            self._guard(windows.finish)  # a window cut short: partial
        self._training = False
        # hand over to the worker, nothing of ours stays; an evaluation still open (it raised
        # inside train()) keeps its window (incomplete)
        self._end(_Unended("an evaluation did not end"))

    # -- evaluation: one step per batch, from one on_prediction_step to the next -----------

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        windows = self._evaluate
        if windows is None:
            return
        if windows.open_step is not None:  # this batch ends the step begun at the last one
            if not windows.end_quiet():
                self._guard(windows.end, windows.open_step)
            windows.next_step += 1
        elif not self._evaluating:  # the evaluation's first batch: its end begins step 0
            self._guard(self._begin_evaluation, args, state, kwargs, sys._getframe(1))
        if not windows.begin_quiet(windows.next_step):
            self._guard(windows.begin, windows.next_step, "evaluate_step")

    def _begin_evaluation(
        self, args: TrainingArguments, state: TrainerState, kwargs: dict[str, Any],
        caller: FrameType,
    ) -> None:  # fmt: skip
        self._evaluating = True
        _unended.add(self)
        if not self._training:  # evaluate() or predict() on its own
            self._start(args, state, kwargs.get("model"), caller)
        batches: int | None = None
        with contextlib.suppress(Exception):  # none, or a loader without a length
            batches = len(kwargs["eval_dataloader"])
        planned = None if batches is None else batches - 1
        detail = f"{batches} batches, the first of which is not a step"
        self.attachment.restart("evaluate", 0, planned, detail)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        self._end_evaluation()

    def on_predict(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        metrics: Any = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        self._end_evaluation()

    def _end_evaluation(self) -> None:
        if not self._evaluating:
            return
        self._evaluating = False
        windows = self.attachment.windows["evaluate"]
        # the step begun at the last batch's end (next_step, open) has no batch: not a step
        self._guard(windows.finish, windows.next_step - 1)  # a window cut short: partial
        session = windows.session
        if session is not None and session.window_open:  # opened for that step: nothing in it
            self._guard(session.flush)
        if not self._training:
            self._end()

    # -- run, ranks ------------------------------------------------------------------------

    def _start(
        self, args: TrainingArguments, state: TrainerState, model: Any, caller: FrameType
    ) -> None:
        """This process's options (once), the worker, the system metrics, the watcher."""
        if self.attachment.options is None and state.is_world_process_zero:
            _set_up_mlflow_callback(args, state, model, caller)
        rank, world_size = getattr(args, "process_index", None), getattr(args, "world_size", None)
        self.attachment.start(rank=rank, world_size=world_size, broadcast=_broadcast)
        self.attachment.start_watch()


class _Unended(NeuronMlflowError):
    """What an open window is kept with when its ``train()`` never reached its end."""


def _set_up_mlflow_callback(
    args: TrainingArguments, state: TrainerState, model: Any, caller: FrameType
) -> None:
    """Make the run of the Trainer's ``MLflowCallback`` (found in the calling handler) active,
    for the options to take: one after ours in the list is set up now, as its own first hook
    would (it sets up once)."""
    from transformers.integrations import MLflowCallback
    from transformers.trainer_callback import CallbackHandler

    callbacks: list[Any] = []
    frame: FrameType | None = caller
    for _ in range(4):  # the handler's call_event, or its on_<event> above it
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, CallbackHandler):
            callbacks = list(owner.callbacks)
            break
        frame = frame.f_back
    del frame
    for callback in callbacks:
        if isinstance(callback, MLflowCallback):
            if not getattr(callback, "_initialized", True):
                callback.setup(args, state, model)
            import mlflow

            if mlflow.active_run() is not None:
                return


def _broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (set-up only): Accelerate's broadcast (XLA included),
    else ``torch.distributed``'s."""
    box = [value]
    try:
        from accelerate.utils import broadcast_object_list
    except ImportError:
        import torch.distributed as dist

        dist.broadcast_object_list(box, src=0)
    else:
        broadcast_object_list(box, from_process=0)
    return box[0]


@atexit.register
def _end_at_exit() -> None:
    """A ``train()`` that raised, then the process ends: its open window is kept
    (incomplete), as the Lightning callback does on an exception."""
    failure = getattr(sys, "last_value", None)  # the exception that ended the script
    exc = failure if isinstance(failure, BaseException) else _Unended("the process ended")
    for callback in list(_unended):
        with contextlib.suppress(Exception):
            callback._end(exc)
