"""Two NeuronProfilerCallbacks on one Trainer: each logs its windows and keeps its own state."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger
from mlflow import MlflowClient

import neuron_mlflow as nm
from tests.helpers import metric_history


def _fit(callbacks, logger, tmp_path, max_epochs, ckpt_path=None) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[*callbacks, checkpoint],
        logger=logger,
        max_epochs=max_epochs,
        limit_train_batches=4,
        limit_val_batches=3,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    for callback in callbacks:
        assert callback.wait()  # the windows in MLflow (fit does not wait for them)


def _callbacks() -> tuple[nm.NeuronProfilerCallback, nm.NeuronProfilerCallback]:
    schedule = nm.Schedule(warmup=0, active=2)
    return (
        nm.NeuronProfilerCallback(schedule=schedule, stages=("train",), backend="cpu"),
        nm.NeuronProfilerCallback(schedule=schedule, stages=("validate",), backend="cpu"),
    )


def test_two_callbacks_log_their_windows_and_restore_their_own_state(
    tracking_uri, tmp_path
) -> None:
    logger = MLFlowLogger(experiment_name="cb-two", tracking_uri=tracking_uri)
    train, validate = _callbacks()
    assert train.state_key != validate.state_key
    assert "'stages': ('train',)" in train.state_key and "active=2" in train.state_key
    _fit([train, validate], logger, tmp_path, max_epochs=1)

    run_id = logger.run_id
    experiment = MlflowClient().get_experiment_by_name("cb-two")
    assert len(MlflowClient().search_runs([experiment.experiment_id])) == 1
    assert metric_history(run_id, "profile/train/steps") == [(2, 2.0)]
    assert metric_history(run_id, "profile/validate/steps") == [(1, 2.0)]
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"]
    assert saved[train.state_key]["done"]["train"] == [0]
    assert saved[train.state_key]["done"]["validate"] == []
    assert saved[validate.state_key]["done"]["validate"] == [0]
    assert saved[validate.state_key]["done"]["train"] == []

    resumed = MLFlowLogger(experiment_name="cb-two", tracking_uri=tracking_uri, run_id=run_id)
    train2, validate2 = _callbacks()
    _fit([train2, validate2], resumed, tmp_path, max_epochs=2,
         ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))  # fmt: skip
    assert {s: d for s, d in train2.state_dict()["done"].items() if d} == {"train": [0]}
    assert {s: d for s, d in validate2.state_dict()["done"].items() if d} == {"validate": [0]}
    # the restored windows are not logged again
    assert metric_history(run_id, "profile/train/steps") == [(2, 2.0)]
    assert metric_history(run_id, "profile/validate/steps") == [(1, 2.0)]
