"""The Lightning callback's stage table: where each stage's steps begin and end.

:class:`~neuron_mlflow.integrations.lightning.NeuronProfilerCallback` makes the evaluation
stages' hooks from their rows of :data:`STAGE_HOOKS` (the train row's are written out; a test
checks every hook named here is one of its methods). Only names here: nothing imports
``lightning``.

Example:
    >>> [row.batch_start for row in STAGE_HOOKS][:2]
    ['on_train_batch_start', 'on_validation_batch_start']
"""

from __future__ import annotations

from dataclasses import dataclass

STAGES = ("train", "validate", "test", "predict")
"""Stages the callback can profile."""


@dataclass(frozen=True)
class StageHooks:
    """Where one stage's steps come from in Lightning.

    Attributes:
        stage: the stage's name (its metric prefix is ``<metric_prefix>/<stage>``).
        start, batch_start, batch_end, end: the Lightning hooks where a run of the stage
            starts, where a step begins, where it ends, and where the run ends.
        planned: the Trainer attribute with the number of steps the stage plans.
    """

    stage: str
    start: str
    batch_start: str
    batch_end: str
    end: str
    planned: str


STAGE_HOOKS = (
    StageHooks("train", "on_train_start", "on_train_batch_start", "on_train_batch_end",
               "on_train_end", "estimated_stepping_batches"),
    StageHooks("validate", "on_validation_epoch_start", "on_validation_batch_start",
               "on_validation_batch_end", "on_validation_epoch_end", "num_val_batches"),
    StageHooks("test", "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end",
               "on_test_epoch_end", "num_test_batches"),
    StageHooks("predict", "on_predict_epoch_start", "on_predict_batch_start",
               "on_predict_batch_end", "on_predict_epoch_end", "num_predict_batches"),
)  # fmt: skip
"""The stage table: where each stage's steps begin and end, and how many it plans."""
