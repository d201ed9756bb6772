"""One engine: for every way of profiling, the metrics a live window logged to MLflow equal
``neuron-mlflow summarize`` of the trace that the window uploaded (same operators, same calls,
times within 1%)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.naming import window_metrics
from neuron_mlflow.trace.summarize import summarize_trace
from tests.helpers import artifact_files, inputs, metrics, rmsnorm_naive

TOP_K = 1000  # every operator gets its metrics


def _decorated(tmp_path: Path, tracking_uri: str) -> tuple[str, str]:
    @nm.profile(backend="cpu", schedule=nm.Schedule(warmup=1, active=3), top_k=TOP_K)
    def step(x, w):
        return rmsnorm_naive(x, w).sum()

    x, w = inputs()
    for _ in range(6):
        torch.zeros(3) + 1  # work between calls: left out
        step(x, w)
    return step.profiler.run_id, "profile"


def _context_manager(tmp_path: Path, tracking_uri: str) -> tuple[str, str]:
    x, w = inputs()
    with nm.profile(backend="cpu", schedule=nm.Schedule(warmup=1, active=3), top_k=TOP_K) as p:
        for _ in range(6):
            rmsnorm_naive(x, w)
            p.step()
    return p.run_id, "profile"


def _compiled(tmp_path: Path, tracking_uri: str) -> tuple[str, str]:
    compiled = torch.compile(rmsnorm_naive)

    @nm.profile(backend="cpu", schedule=nm.Schedule(wait=2, warmup=1, active=3), top_k=TOP_K)
    def step(x, w):
        return compiled(x, w)

    x, w = inputs()
    for _ in range(7):
        step(x, w)
    return step.profiler.run_id, "profile"


def _trainer(
    callback, tracking_uri: str, experiment: str, **kwargs
) -> tuple[Trainer, MLFlowLogger]:
    logger = MLFlowLogger(experiment_name=experiment, tracking_uri=tracking_uri)
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": logger,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    options.update(kwargs)
    return Trainer(callbacks=[callback, *options.pop("callbacks", [])], **options), logger


def _lightning_validation_inside(tmp_path: Path, tracking_uri: str) -> tuple[str, str]:
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=1, warmup=1, active=4), backend="cpu", top_k=TOP_K
    )
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3)
    trainer, logger = _trainer(
        callback,
        tracking_uri,
        "live-vs-summarize-validation",
        max_steps=8,
        limit_val_batches=4,
        val_check_interval=4,  # validation after step 4: inside the window (steps 2-5)
        callbacks=[checkpoint],
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    assert callback.wait()
    return logger.run_id, "profile/train"


class TwoOptimizers(BoringModel):
    """Manual optimization with two optimizers, both stepping every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.second = torch.nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        loss = self.layer(batch).sum()
        first.zero_grad()
        self.manual_backward(loss)
        first.step()
        loss2 = self.second(batch).pow(2).sum()
        second.zero_grad()
        self.manual_backward(loss2)
        second.step()

    def configure_optimizers(self):
        return (
            torch.optim.SGD(self.layer.parameters(), lr=0.1),
            torch.optim.SGD(self.second.parameters(), lr=0.1),
        )


def _lightning_manual(tmp_path: Path, tracking_uri: str) -> tuple[str, str]:
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=1, warmup=1, active=2, repeat=2), backend="cpu", top_k=TOP_K
    )
    trainer, logger = _trainer(
        callback,
        tracking_uri,
        "live-vs-summarize-manual",
        max_epochs=1,
        limit_train_batches=10,
        limit_val_batches=0,
        enable_checkpointing=False,
    )
    module: LightningModule = TwoOptimizers()
    trainer.fit(module)
    assert callback.wait()
    files = artifact_files(logger.run_id)
    # both scheduled windows (steps 2-3 and 6-7: one step per batch), none missed
    for folder in ("profile/train/step_000002-000003", "profile/train/step_000006-000007"):
        assert f"{folder}/summary.md" in files, files
    return logger.run_id, "profile/train"


CASES = [
    pytest.param(_decorated, id="decorated function"),
    pytest.param(_context_manager, id="context manager"),
    pytest.param(_compiled, id="torch.compile", marks=pytest.mark.slow),
    pytest.param(_lightning_validation_inside, id="lightning validation and checkpoint"),
    pytest.param(_lightning_manual, id="lightning manual optimization, two optimizers"),
]


@pytest.mark.parametrize("profiled", CASES)
def test_live_metrics_equal_summarize_of_the_uploaded_trace(
    profiled, tmp_path, tracking_uri, capsys
) -> None:
    run_id, prefix = profiled(tmp_path, tracking_uri)
    client = MlflowClient()
    files = artifact_files(run_id)
    folders = sorted({f.split("/traces/")[0] for f in files if "/traces/rank_0/" in f})
    folder = folders[-1]  # the last window: its metrics are the run's latest values
    (trace_file,) = [f for f in files if f.startswith(f"{folder}/traces/rank_0/")]
    local = Path(client.download_artifacts(run_id, trace_file, str(tmp_path / "dl")))

    live = {k: v for k, v in metrics(run_id).items() if k.startswith(prefix + "/")}
    live = {k: v for k, v in live.items() if "/rank/" not in k and "device_busy" not in k}
    result = summarize_trace(local)
    offline = window_metrics(result.summary, prefix, TOP_K)
    assert result.summary.ops, "the window counted operators"
    ops = result.summary.ops
    assert not any(op.name.startswith(("neuron_mlflow", "ProfilerStep")) for op in ops)
    if prefix == "profile/train":  # a marked training window: no validation, no checkpoint
        assert not any("save" in op.name or "no_grad" in op.name for op in result.summary.ops)
    other_windows = {k for k in live if k not in offline}
    assert set(offline) <= set(live), set(offline) - set(live)
    # keys only in live belong to operators of earlier windows of the run (latest values),
    # or are the per-step spread, computed from the same trace's steps (steps.jsonl)
    assert all("/op/" in k or k.endswith(("_p50", "_iqr")) for k in other_windows), other_windows
    for key, value in offline.items():
        if key.endswith(("/calls", "op_calls", "/steps")):
            assert live[key] == value, key
        else:
            assert live[key] == pytest.approx(value, rel=0.01, abs=1e-6), key

    # the command prints the same table from the same file
    assert main(["summarize", str(local), "--top", "5"]) == 0
    printed = capsys.readouterr().out
    top = result.summary.ops[0]
    assert top.name.split("::")[-1][:20] in printed
    if local.suffix == ".gz":
        json.loads(gzip.decompress(local.read_bytes()))  # a valid, complete trace


def test_a_training_window_is_the_same_with_or_without_validation_inside(
    tmp_path, tracking_uri
) -> None:
    def window(val_check_interval: int, experiment: str):
        callback = nm.NeuronProfilerCallback(
            schedule=nm.Schedule(wait=1, warmup=1, active=4), backend="cpu", top_k=TOP_K
        )
        trainer, _ = _trainer(
            callback,
            tracking_uri,
            experiment,
            max_steps=8,
            limit_val_batches=4,
            val_check_interval=val_check_interval,
            enable_checkpointing=False,
        )
        trainer.fit(BoringModel())
        return callback.summaries["train"]

    plain = window(8, "window-without-validation")  # validation after the window
    validated = window(3, "window-with-validation")  # validation after step 3: inside
    assert validated.steps == plain.steps == 4
    assert validated.op_calls == plain.op_calls
    calls = {(op.name, op.calls) for op in plain.ops}
    assert {(op.name, op.calls) for op in validated.ops} == calls
