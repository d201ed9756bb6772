"""No hook of ours calls a collective: each rank's worker logs its own times.

A strategy that counts every collective (``all_gather``, ``broadcast``, ``barrier``,
``reduce``) once the fit has begun: the same fit with and without our callback makes the same
calls, and rank 0's own times still land in the run.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import SingleDeviceStrategy

import neuron_mlflow as nm
from tests.helpers import metrics


class CountingStrategy(SingleDeviceStrategy):
    """Counts the collectives called after ``on_train_start``."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))
        self.counting = False
        self.calls: list[str] = []

    def _count(self, name: str) -> None:
        if self.counting:
            self.calls.append(name)

    def all_gather(self, tensor, group=None, sync_grads=False):
        self._count("all_gather")
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    def broadcast(self, obj, src=0):
        self._count("broadcast")
        return super().broadcast(obj, src)

    def barrier(self, name=None):
        self._count("barrier")
        return super().barrier(name)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        self._count("reduce")
        return super().reduce(tensor, group=group, reduce_op=reduce_op)


class StartCounting(Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        trainer.strategy.counting = True


def _fit(callbacks: list[Callback]) -> CountingStrategy:
    strategy = CountingStrategy()
    trainer = Trainer(
        max_steps=8, callbacks=[StartCounting(), *callbacks], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, strategy=strategy, accelerator="cpu", devices=1,
    )  # fmt: skip
    trainer.fit(BoringModel())
    return strategy


def test_the_callback_adds_no_collective_to_any_step(tmp_path) -> None:
    callback = nm.NeuronProfilerCallback(
        backend="cpu", strict=True, schedule=nm.Schedule(warmup=1, active=2, repeat=2),
        local_dir=tmp_path / "spool",
    )  # fmt: skip
    with_us = _fit([callback])
    without = _fit([])
    assert with_us.calls == without.calls, "our hooks called a collective"
    assert callback.wait()  # the worker's upload (fit does not wait for it)
    got = metrics(callback.run_id)
    assert got["profile/train/rank/0/cpu_time_us"] > 0, "rank 0's worker logged its own times"
