"""A two-process DDP fit on CPU (gloo) with the callback; run by test_callback_ddp.py.

Usage: python tests/ddp_job.py TRACKING_URI EXPERIMENT LOCAL_DIR [MODE]
Lightning's DDP launcher starts rank 1 by re-running this script.

MODE: ``all`` (default: both ranks capture), ``rank1-off`` (rank 1's ``local_dir`` is a
file, so profiling turns itself off at its first window), ``ranks0`` (``ranks=[0]``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger

import neuron_mlflow as nm


def main(tracking_uri: str, experiment: str, local_dir: str, mode: str = "all") -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if mode == "rank1-off" and rank == 1:
        blocker = Path(local_dir).parent / "not-a-folder"
        blocker.write_text("a file where rank 1's spool folder should be")
        local_dir = str(blocker / "spool")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=1, warmup=1, active=2, repeat=2),
        backend="cpu",
        local_dir=local_dir,
        strict=mode == "all",
        ranks=[0] if mode == "ranks0" else None,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=10,
        limit_val_batches=0,
        logger=MLFlowLogger(experiment_name=experiment, tracking_uri=tracking_uri),
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    callback.wait()  # each rank's windows in MLflow before the test reads the run
    if trainer.is_global_zero:
        print(f"RUN_ID={callback.run_id}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
