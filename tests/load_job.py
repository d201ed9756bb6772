"""One job of the PostgreSQL load test: a Lightning DDP fit (CPU, gloo) under ``torchrun``.

Usage (run by tests/sinks/test_postgres_load.py):

    python -m torch.distributed.run --standalone --nproc_per_node 4 \
        tests/load_job.py TRACKING_URI EXPERIMENT RUN_NAME LOCAL_DIR

Lightning detects the TorchElastic environment ``torchrun`` sets up and joins its ranks; every
rank profiles with ``NeuronProfilerCallback``. Each training step runs :data:`OPS` distinct
operators (``record_function`` ranges ``load_op_000`` ... ``load_op_499``, each around one
small aten call) besides the tiny model's forward, backward and SGD step; the schedule makes
:data:`WINDOWS` windows of one recorded step each, with ``top_k`` high enough that every
operator of a window becomes metrics. Rank 0 prints ``RUN_ID=<id>``.
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.profiler import record_function
from torch.utils.data import DataLoader, TensorDataset

import neuron_mlflow as nm

OPS = 500
WINDOWS = 3
RANKS = 4
SCHEDULE = nm.Schedule(wait=0, warmup=1, active=1, repeat=WINDOWS)
STEPS = WINDOWS * (SCHEDULE.wait + SCHEDULE.warmup + SCHEDULE.active)
TOP_K = 2000  # more than the rows of a window: every operator is logged as metrics

# A few cheap aten calls, taken in turn by the named operators.
_CALLS = (
    lambda x: x * 1.0001,
    lambda x: x + 0.5,
    torch.relu,
    torch.tanh,
    torch.abs,
    lambda x: torch.clamp(x, -1.0, 1.0),
    torch.neg,
    torch.sigmoid,
)


def five_hundred_ops(x: torch.Tensor) -> torch.Tensor:
    """:data:`OPS` top-level operators, each name distinct, each one small aten call."""
    for i in range(OPS):
        with record_function(f"load_op_{i:03d}"):
            x = _CALLS[i % len(_CALLS)](x)
    return x


class LoadModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        with torch.no_grad():
            five_hundred_ops(torch.randn(4, 8))
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(STEPS * RANKS * 2, 8)), batch_size=2)


def main(tracking_uri: str, experiment: str, run_name: str, local_dir: str) -> None:
    torch.set_num_threads(1)
    callback = nm.NeuronProfilerCallback(
        schedule=SCHEDULE, backend="cpu", local_dir=local_dir, top_k=TOP_K, strict=True
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=RANKS,
        num_nodes=1,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=STEPS,
        logger=MLFlowLogger(
            experiment_name=experiment, run_name=run_name, tracking_uri=tracking_uri
        ),
        callbacks=[callback],
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LoadModel())
    callback.wait()  # this rank's windows in MLflow before the test reads the run
    if trainer.is_global_zero:
        print(f"RUN_ID={callback.run_id}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
