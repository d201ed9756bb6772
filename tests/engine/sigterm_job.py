"""A Trainer.fit that a test stops with SIGTERM in the middle of a window.

Usage: python tests/engine/sigterm_job.py LOCAL_DIR
Prints ``STEP <n>`` as each training step begins (flushed), and sleeps a little per step.
"""

from __future__ import annotations

import sys
import time

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

import neuron_mlflow as nm


class SlowModel(BoringModel):
    def training_step(self, batch, batch_idx):
        print(f"STEP {self.global_step}", flush=True)
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)


def main(local_dir: str) -> None:
    callback = nm.NeuronProfilerCallback(
        backend="cpu", strict=False, local_dir=local_dir,
        schedule=nm.Schedule(warmup=1, active=500),
    )  # fmt: skip
    trainer = Trainer(
        max_steps=1000, callbacks=[callback], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        accelerator="cpu",
    )  # fmt: skip
    trainer.fit(SlowModel())


if __name__ == "__main__":
    main(sys.argv[1])
