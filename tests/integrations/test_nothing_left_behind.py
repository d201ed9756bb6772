"""Nothing of ours is left running after a Trainer call, or a closed profiler, ends (issue #33).

After ``Trainer.fit`` / ``validate`` / ``test`` / ``predict`` returns (or raises), and after a
decorated function's profiler is closed (or a ``with`` block raised): no thread of ours
(``neuron-mlflow-*``) runs, every signal handler is what it was before (SIGTERM keeps the open
window, SIGUSR2 asks for a window: both ours while the job runs), and no exit hook of ours
remains for the closed session. Each test first checks that the thread and the handlers were
there while the job ran, so that their absence afterwards means something. The capture-request
poller runs (the test set-up turns it off for other tests), with a period longer than a test,
so that its end never meets a poll under way on a busy machine.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger

import neuron_mlflow as nm
from neuron_mlflow.engine import session as engine_session
from neuron_mlflow.engine import system_metrics
from neuron_mlflow.integrations import decorator
from tests.helpers import metric_history

POLL_S = 60.0  # (ProfilerConfig's default: 10 s)
CHECKED = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


class Boom(RuntimeError):
    """The user's own failure (it must reach the caller unchanged)."""


def _ours(handler: Any) -> bool:
    return str(getattr(handler, "__module__", "")).startswith("neuron_mlflow")


def _our_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("neuron-mlflow"))


def _exit_hooks_of_ours() -> set[int]:
    """What our exit hooks would act on: the sessions and profilers not closed, the samplers
    running (ids: the sets hold them weakly)."""
    return {
        *(id(s) for s in engine_session._open_sessions),
        *(id(p) for p in decorator._open_profilers),
        *(id(s) for s in system_metrics._running),
    }


@dataclass
class Seen:
    """Our threads and handlers seen while the job ran."""

    threads: set[str] = field(default_factory=set)
    handlers: set[str] = field(default_factory=set)

    def look(self) -> None:
        self.threads.update(_our_threads())
        for signum in CHECKED:
            if _ours(signal.getsignal(signum)):
                self.handlers.add(signal.Signals(signum).name)


@contextlib.contextmanager
def nothing_left_behind(seen: Seen, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Assert that the block leaves no thread, signal handler or exit hook of ours, and that
    the block had the capture-request thread and our SIGTERM and SIGUSR2 handlers running.

    Exit hooks: every ``atexit`` registration in the block is recorded (and made): modules
    imported on first use (MLflow's, requests') register theirs; each of ours must be gone."""
    handlers = {signum: signal.getsignal(signum) for signum in CHECKED}
    exit_hooks = atexit._ncallbacks()
    hooked = _exit_hooks_of_ours()
    registered: list[Any] = []
    register = atexit.register

    def recording(fn: Any, *args: Any, **kwargs: Any) -> Any:
        registered.append(fn)
        return register(fn, *args, **kwargs)

    monkeypatch.setattr(atexit, "register", recording)
    assert not _our_threads(), "a thread of an earlier test still runs"
    yield
    monkeypatch.setattr(atexit, "register", register)
    assert "neuron-mlflow-capture-0" in seen.threads, "the poller ran while the job did"
    assert {"SIGTERM", "SIGUSR2"} <= seen.handlers, "our handlers were in place meanwhile"
    assert _our_threads() == []
    changed = {
        signal.Signals(signum).name: (before, signal.getsignal(signum))
        for signum, before in handlers.items()
        if signal.getsignal(signum) != before
    }
    assert changed == {}, "every signal handler is back to what it was"
    others = [fn for fn in registered if not _ours(fn)]
    assert atexit._ncallbacks() == exit_hooks + len(others), "an exit hook of ours is left"
    assert _exit_hooks_of_ours() <= hooked, "no closed session is left to our exit hooks"


# -- Lightning: every Trainer call, returning or raising ------------------------------------

STAGE_CALLS = {"train": "fit", "validate": "validate", "test": "test", "predict": "predict"}
STEP_METHODS = {
    "train": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


def _model(stage: str, fail_at: int | None) -> BoringModel:
    """A BoringModel whose ``stage`` step raises :class:`Boom` at batch ``fail_at``."""
    method = STEP_METHODS[stage]
    original = getattr(BoringModel, method)

    def step(self: BoringModel, batch: Any, batch_idx: int, *rest: Any) -> Any:
        if batch_idx == fail_at:
            raise Boom(f"batch {batch_idx} failed")
        return original(self, batch, batch_idx, *rest)

    return type("Model", (BoringModel,), {method: step})()


class Look(Callback):
    """After the profiler's hooks of each step: what of ours runs now."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen.look()

    def on_validation_batch_end(self, *args: Any) -> None:
        self.seen.look()

    def on_test_batch_end(self, *args: Any) -> None:
        self.seen.look()

    def on_predict_batch_end(self, *args: Any) -> None:
        self.seen.look()


def _trainer_call(
    stage: str, tracking_uri: str, fail_at: int | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, str]:
    seen = Seen()
    logger = MLFlowLogger(experiment_name=f"left-behind-{stage}", tracking_uri=tracking_uri)
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=3),  # steps 1-3, open while step 2 runs
        stages=(stage,),
        backend="cpu",
        poll_s=POLL_S,
        strict=fail_at is None,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback, Look(seen)],
        logger=logger,
        max_steps=6,
        limit_train_batches=6,
        limit_val_batches=6,
        limit_test_batches=6,
        limit_predict_batches=6,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    call = getattr(trainer, STAGE_CALLS[stage])
    with nothing_left_behind(seen, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        if fail_at is None:
            call(_model(stage, None))
        else:
            with pytest.raises(Boom, match=f"batch {fail_at} failed"):
                call(_model(stage, fail_at))
    return callback, logger.run_id


@pytest.mark.parametrize("stage", list(STAGE_CALLS))
def test_a_trainer_call_leaves_nothing_running(stage, tracking_uri, monkeypatch) -> None:
    callback, run_id = _trainer_call(stage, tracking_uri, None, monkeypatch)
    assert callback.wait()  # the worker process finishes the window
    metric_step = 4 if stage == "train" else 3  # global_step after it / the batch index
    assert metric_history(run_id, f"profile/{stage}/steps") == [(metric_step, 3.0)]


@pytest.mark.parametrize("stage", list(STAGE_CALLS))
def test_a_trainer_call_that_raises_leaves_nothing_running(
    stage, tracking_uri, monkeypatch
) -> None:
    callback, _ = _trainer_call(stage, tracking_uri, 2, monkeypatch)  # inside the window
    assert callback.wait()  # the incomplete window is kept, not uploaded


# -- the decorator -----------------------------------------------------------------------


def _profiled(seen: Seen, tmp_path: Any, fail_at: int | None = None) -> Any:
    calls = []

    @nm.profile(schedule=nm.Schedule(warmup=1, active=3), backend="cpu", poll_s=POLL_S,
                local_dir=str(tmp_path / "spool"), strict=fail_at is None)  # fmt: skip
    def step(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        seen.look()
        if len(calls) - 1 == fail_at:
            raise Boom(f"call {fail_at} failed")
        return x * 2

    return step


def test_a_closed_profiler_leaves_nothing_running(tmp_path, monkeypatch) -> None:
    seen = Seen()
    with nothing_left_behind(seen, monkeypatch):
        step = _profiled(seen, tmp_path)
        for _ in range(6):
            step(torch.ones(4))
        step.profiler.close()
    assert step.profiler.wait()
    assert step.profiler.summary is not None and step.profiler.summary.steps == 3


def test_a_profiler_closed_after_the_function_raised_leaves_nothing_running(
    tmp_path, monkeypatch
) -> None:
    seen = Seen()
    with nothing_left_behind(seen, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        step = _profiled(seen, tmp_path, fail_at=2)  # inside the window
        step(torch.ones(4))
        step(torch.ones(4))
        with pytest.raises(Boom, match="call 2 failed"):
            step(torch.ones(4))
        step.profiler.close()


def test_a_with_block_that_raises_leaves_nothing_running(tmp_path, monkeypatch) -> None:
    seen = Seen()
    with nothing_left_behind(seen, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        with (
            pytest.raises(Boom, match="in the block"),
            nm.profile(schedule=nm.Schedule(warmup=1, active=3), backend="cpu", poll_s=POLL_S,
                       local_dir=str(tmp_path / "spool"), strict=False) as prof,
        ):  # fmt: skip
            for _ in range(3):
                _ = torch.ones(4) * 2
                prof.step()
                seen.look()
            raise Boom("in the block")
