"""A Lightning fit on CPU with no scheduled window, for the on-demand capture tests.

Usage: python tests/engine/capture_job.py TRACKING_URI EXPERIMENT WORK_DIR MODE [POLL_S]

MODE: ``requests`` (steps of 20 ms until WORK_DIR/stop exists), ``ddp`` (the same on two
gloo processes), ``slow`` (30 ms steps, 60 ms from step 60; the slow-step trigger on; 200
steps), ``fixed`` (1000 steps of 5 ms, no Lightning logger: the server-down benchmark). The
run id goes to WORK_DIR/run_id as soon as it is known; the spool is WORK_DIR/spool.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger

import neuron_mlflow as nm

SLOW_FROM = 60


class SleepyModel(BoringModel):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.mode == "slow":
            time.sleep(0.06 if self.trainer.global_step >= SLOW_FROM else 0.03)
        elif self.mode == "fixed":
            time.sleep(0.005)
        else:
            time.sleep(0.02)
        return super().training_step(batch, batch_idx)


class StopFile(Callback):
    def __init__(self, work: Path) -> None:
        self.work = work

    def on_train_start(self, trainer: Trainer, pl_module: object) -> None:
        if trainer.is_global_zero:
            cb = nm.NeuronProfilerCallback
            callback = next(c for c in trainer.callbacks if isinstance(c, cb))
            (self.work / "run_id.tmp").write_text(str(callback.run_id))
            os.replace(self.work / "run_id.tmp", self.work / "run_id")

    def on_train_batch_end(self, trainer: Trainer, *args: object) -> None:
        if trainer.global_step % 10 == 0 and (self.work / "stop").exists():
            trainer.should_stop = True


def main(tracking_uri: str, experiment: str, work_dir: str, mode: str, poll_s: str = "0.5"):
    work = Path(work_dir)
    trigger = None
    if mode == "slow":
        trigger = nm.SlowSteps(factor=1.5, baseline_steps=30, min_steps=3, max_windows=3,
                               cooldown_steps=1000)  # fmt: skip
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(skip_first=10**9),  # no scheduled window: requests only
        backend="cpu",
        local_dir=str(work / "spool"),
        poll_s=float(poll_s),
        trigger=trigger,
        strict=True,
    )
    max_steps = {"slow": 200, "fixed": 1000}.get(mode, 100_000)
    trainer = Trainer(
        accelerator="cpu",
        devices=2 if mode == "ddp" else 1,
        strategy="ddp" if mode == "ddp" else "auto",
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False  # the server-down benchmark: only our calls talk to the server
        if mode == "fixed"
        else MLFlowLogger(experiment_name=experiment, tracking_uri=tracking_uri),
        callbacks=[callback, StopFile(work)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    started = time.perf_counter()
    trainer.fit(SleepyModel(mode))
    fit_s = time.perf_counter() - started
    callback.wait()  # the windows in MLflow before the test reads the run
    if trainer.is_global_zero:
        print(f"FIT_S={fit_s:.3f}")
        print(f"RUN_ID={callback.run_id}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
