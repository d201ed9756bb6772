"""``Trainer.fit`` returns when training ends; ``callback.wait()`` is what waits for MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger

import neuron_mlflow as nm
from neuron_mlflow.engine.worker import WorkerClient
from tests.helpers import metric_history


class HoldTheWorker(Callback):
    """From the window's last step on, hold a capturing claim on the spool, as a window being
    captured does: the worker process starts no job while one is held (at most 30 s), so the
    window cannot be uploaded until :meth:`release`."""

    def __init__(self, local_dir: Path, step: int) -> None:
        self.client = WorkerClient(local_dir.absolute())
        self.step = step
        self.claim: Any = None

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and self.claim is None:
            self.claim = self.client.capturing()
            assert self.claim is not None

    def release(self) -> None:
        self.claim.release()


def test_fit_returns_before_the_upload_and_wait_lands_the_window(tracking_uri, tmp_path) -> None:
    local_dir = tmp_path / "spool"
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=3),  # steps 1-3
        backend="cpu",
        local_dir=str(local_dir),
        upload_timeout_s=120,  # a teardown that waited would wait out the hold (30 s)
    )
    hold = HoldTheWorker(local_dir, step=3)
    logger = MLFlowLogger(experiment_name="fit-returns", tracking_uri=tracking_uri)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback, hold],
        logger=logger,
        max_steps=6,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(BoringModel())
        assert metric_history(logger.run_id, "profile/train/steps") == [], (
            "fit returned before the worker could upload the window"
        )
    finally:
        hold.release()
    assert callback.wait()
    assert metric_history(logger.run_id, "profile/train/steps") == [(4, 3.0)]
    assert callback.summaries["train"].steps == 3
