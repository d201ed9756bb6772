"""Per-rank values are gathered with a tensor on the strategy's root device (as NCCL needs)."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import SingleDeviceStrategy

import neuron_mlflow as nm
from tests.helpers import metrics

DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class NcclLikeStrategy(SingleDeviceStrategy):
    """Rejects a tensor that is not on the root device, as NCCL rejects CPU tensors.

    On a CPU-only machine the root device is the CPU itself; with CUDA, this is exactly the
    multi-GPU DDP failure of a CPU float64 tensor.
    """

    gathered: list[torch.device]

    def all_gather(self, tensor, group=None, sync_grads=False):
        self.gathered = [*getattr(self, "gathered", []), tensor.device]
        if tensor.device != self.root_device:
            raise RuntimeError(f"Tensors must be on {self.root_device} (got {tensor.device})")
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)


def test_per_rank_times_are_gathered_on_the_root_device(tmp_path) -> None:
    strategy = NcclLikeStrategy(device=DEVICE)
    callback = nm.NeuronProfilerCallback(
        backend="cpu", strict=True, schedule=nm.Schedule(warmup=1, active=2),
        local_dir=tmp_path / "spool",
    )  # fmt: skip
    trainer = Trainer(
        max_steps=4, callbacks=[callback], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        strategy=strategy, accelerator="gpu" if DEVICE.type == "cuda" else "cpu", devices=1,
    )  # fmt: skip
    trainer.fit(BoringModel())
    assert strategy.gathered == [strategy.root_device]
    got = metrics(callback.run_id)
    assert got["profile/train/rank/0/cpu_time_us"] > 0, "the uploader sent the gathered times"
