"""A small Lightning job (a two-layer transformer encoder on synthetic data) profiled with
``NeuronProfilerCallback`` on train and validate, logged through ``MLFlowLogger``.

Run it with::

    python recipes/train.py --steps 40 --batch-size 8 --wait 5 --warmup 2 --active 3

The run is named after what it trained and when (``train TinyTransformer 40 steps 2026-12-04
14:02``); its tag ``result`` (e.g. ``train 12.3 ms/step, validate 4.1 ms/step (wall)``) and the
metric ``train_step_ms`` are the headline a person adds as columns in the runs list. Under
``mlflow run . -e train`` it logs into the run that ``mlflow run`` created.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

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


def headline(summaries: dict[str, nm.OpSummary]) -> str:
    """Wall time per profiled step of each stage, for the runs list's ``result`` column."""
    parts = [f"{stage} {s.wall_time_us / 1000:.1f} ms/step" for stage, s in summaries.items()]
    return ", ".join(parts) + " (wall)" if parts else "no window was captured"


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
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:  # MLflow's own switch; set it to see INFO
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    run_id = os.environ.get("MLFLOW_RUN_ID")  # set by `mlflow run`
    name = f"train TinyTransformer {args.steps} steps {time.strftime('%Y-%m-%d %H:%M')}"
    logger = MLFlowLogger(
        experiment_name=args.experiment,
        run_name=name,
        tracking_uri=mlflow.get_tracking_uri(),
        run_id=run_id,
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
    callback.wait()  # the windows in MLflow before the run is read and pointed at
    summaries = dict(callback.summaries)
    for stage, summary in summaries.items():
        print(
            f"profile/{stage}: {summary.steps} steps, {summary.wall_time_us / 1000:.1f} ms wall"
            f" per step, {summary.op_calls:g} op calls"
        )
    result = headline(summaries)
    client, run = logger.experiment, logger.run_id
    client.set_tag(run, "result", result)
    if "train" in summaries:
        client.log_metric(run, "train_step_ms", summaries["train"].wall_time_us / 1000)
    uri = mlflow.get_tracking_uri()
    info = client.get_run(run).info  # (under `mlflow run` the run and its name were made)
    experiment_id = info.experiment_id
    print(f"{result}; run {info.run_name!r} ({run})")
    runs = f"#/experiments/{experiment_id}/runs"
    if uri.startswith(("http://", "https://")):
        print(f"See it in the UI: open {uri.rstrip('/')}/{runs}")
    else:
        print(
            f"See it in the UI: mlflow ui --backend-store-uri {uri}, then open "
            f"http://127.0.0.1:5000/{runs}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
