"""A small Lightning job (a two-layer transformer encoder on synthetic data) profiled with
``NeuronProfilerCallback`` on train and validate, logged through ``MLFlowLogger``.

Run it with::

    python recipes/train.py --steps 40 --batch-size 8 --wait 5 --warmup 2 --active 3

Under ``mlflow run . -e train`` it logs into the run that ``mlflow run`` created.
"""

from __future__ import annotations

import argparse
import os
import sys

import mlflow
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger
from torch.utils.data import DataLoader, TensorDataset

import neuron_mlflow as nm


class TinyTransformer(LightningModule):
    """Two transformer encoder layers and a linear head, regressing a random target."""

    def __init__(self, d_model: int = 64, nhead: int = 4, layers: int = 2) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).squeeze(-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def synthetic(samples: int, seq: int = 16, d_model: int = 64) -> TensorDataset:
    """Random sequences and targets (no download)."""
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(samples, seq, d_model, generator=generator),
        torch.randn(samples, seq, generator=generator),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--wait", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--backend", default="auto", choices=["auto", "neuron", "cuda", "cpu"])
    parser.add_argument("--experiment", default="train")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = os.environ.get("MLFLOW_RUN_ID")  # set by `mlflow run`
    logger = MLFlowLogger(
        experiment_name=args.experiment, tracking_uri=mlflow.get_tracking_uri(), run_id=run_id
    )
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=args.wait, warmup=args.warmup, active=args.active),
        stages=("train", "validate"),
        backend=args.backend,
    )
    trainer = Trainer(
        max_steps=args.steps,
        logger=logger,
        callbacks=[callback],
        limit_val_batches=args.wait + args.warmup + args.active,
        val_check_interval=args.steps,
        log_every_n_steps=max(1, args.steps // 10),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    data = synthetic(args.batch_size * args.steps)
    trainer.fit(
        TinyTransformer(),
        DataLoader(data, batch_size=args.batch_size, shuffle=True),
        DataLoader(data, batch_size=args.batch_size),
    )
    for stage, summary in callback.summaries.items():
        print(
            f"profile/{stage}: {summary.steps} steps, {summary.op_calls:g} op calls, "
            f"{summary.cpu_time_us:.0f} us self CPU per step"
        )
    print(f"run: {logger.run_id} at {mlflow.get_tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
