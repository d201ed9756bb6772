"""HfProfilerCallback with a real transformers.Trainer (a tiny GPT-2 built from a config, random
token ids, nothing downloaded), Transformers' own MLflowCallback and a real MLflow store."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.integrations import MLflowCallback

import neuron_mlflow as nm
from neuron_mlflow.sinks.spool import Spool
from tests.helpers import ROOT, artifact_files, metric_history, metrics, run_python, wait_handled
from tests.integrations.test_nothing_left_behind import POLL_S, Boom, Seen, nothing_left_behind

VOCAB, SEQUENCE = 96, 16


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=32,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def _data(rows: int = 32) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, VOCAB, (SEQUENCE,), generator=generator) for _ in range(rows)]
    return [{"input_ids": x, "labels": x} for x in ids]


def _trainer(
    callbacks: list[Any], tmp_path: Path, trainer_class: type[Trainer] = Trainer, **kwargs: Any
) -> Trainer:
    options: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 5,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "logging_steps": 1,
        "use_cpu": True,
        "save_strategy": "no",
        "report_to": ["mlflow"],
        "disable_tqdm": True,
    }
    options.update(kwargs)
    return trainer_class(
        model=_model(),
        args=TrainingArguments(**options),
        train_dataset=_data(),
        eval_dataset=_data(12),
        callbacks=callbacks,
    )


@pytest.fixture
def experiment(request, monkeypatch) -> str:
    """The experiment MLflowCallback logs to (it reads MLFLOW_EXPERIMENT_NAME)."""
    name = f"hf-{request.node.name}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", name)
    return name


def _runs(experiment: str) -> list[Any]:
    client = MlflowClient()
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


@pytest.mark.parametrize("accumulation", [1, 2])
def test_windows_land_in_the_mlflow_callbacks_run_next_to_its_loss(
    accumulation, experiment, tmp_path
) -> None:
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2), backend="cpu", top_k=200
    )
    trainer = _trainer([callback], tmp_path, gradient_accumulation_steps=accumulation)
    trainer.train()
    assert callback.wait()  # train() returned without waiting for the worker's uploads

    (run,) = _runs(experiment)  # one run: Transformers' own, with our windows in it
    run_id = run.info.run_id
    assert callback.run_id == run_id
    assert [step for step, _ in metric_history(run_id, "loss")] == [1, 2, 3, 4, 5]
    # optimizer steps 1-2 profiled; the metric step is state.global_step when logged
    assert metric_history(run_id, "profile/train/steps") == [(3, 2.0)]
    got = metrics(run_id)
    assert got["profile/train/op_calls"] > 0 and got["profile/train/cpu_time_us"] > 0
    # per window step: one optimizer step, and one forward (two embeddings) per micro-batch
    assert got["profile/train/op/Optimizer.step_AdamW.step/calls"] == 1
    assert got["profile/train/op/aten.embedding/calls"] == 2 * accumulation
    assert "profile/train/rank/0/cpu_time_us" in got
    files = artifact_files(run_id)
    folder = "profile/train/step_000001-000002"
    for name in ("summary.md", "report.html", "summary.json", "steps.jsonl"):
        assert f"{folder}/{name}" in files
    assert any(f.startswith(f"{folder}/traces/rank_0/") for f in files)
    assert callback.summaries["train"].steps == 2


def test_the_mlflow_callbacks_run_is_used_when_it_comes_after_ours(experiment, tmp_path) -> None:
    callback = nm.HfProfilerCallback(schedule=nm.Schedule(warmup=0, active=1), backend="cpu")
    trainer = _trainer([callback], tmp_path, report_to=[], max_steps=2)
    trainer.add_callback(MLflowCallback)  # after ours: its on_train_begin runs after ours
    handler = trainer.callback_handler.callbacks
    assert handler.index(callback) < [type(c) for c in handler].index(MLflowCallback)
    trainer.train()
    assert callback.wait()
    (run,) = _runs(experiment)
    assert callback.run_id == run.info.run_id
    assert metric_history(run.info.run_id, "profile/train/steps") == [(1, 1.0)]
    assert "loss" in metrics(run.info.run_id)


def test_without_mlflow_reporting_the_active_run_is_used(tracking_uri, tmp_path) -> None:
    callback = nm.HfProfilerCallback(schedule=nm.Schedule(warmup=0, active=1), backend="cpu")
    trainer = _trainer([callback], tmp_path, report_to=[], max_steps=2)
    with mlflow.start_run() as run:
        trainer.train()
    assert callback.wait()
    assert callback.run_id == run.info.run_id
    assert metric_history(run.info.run_id, "profile/train/steps") == [(1, 1.0)]


def test_evaluate_profiles_batches_after_the_first(experiment, tmp_path) -> None:
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2),
        stages=("evaluate",),
        backend="cpu",
        top_k=200,
    )
    trainer = _trainer([callback], tmp_path)  # 12 rows, 2 a batch: 6 batches, 5 steps
    trainer.evaluate()  # on its own, no train(): the MLflowCallback's run all the same
    assert callback.wait()
    (run,) = _runs(experiment)
    run_id = run.info.run_id
    assert callback.run_id == run_id
    assert "eval_loss" in metrics(run_id)
    # steps 1-2 (batches 2-3); the metric step is the window's last step
    assert metric_history(run_id, "profile/evaluate/steps") == [(2, 2.0)]
    got = metrics(run_id)
    assert got["profile/evaluate/op/aten.embedding/calls"] == 2  # one forward a step
    assert "profile/evaluate/step_000001-000002/report.html" in artifact_files(run_id)


def test_train_and_evaluate_inside_it_land_in_one_run(experiment, tmp_path) -> None:
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2), stages=("train", "evaluate"), backend="cpu"
    )  # train steps 1-2; the evaluation after step 4 (6 batches): its steps 1-2
    trainer = _trainer([callback], tmp_path, eval_strategy="steps", eval_steps=4)
    trainer.train()
    assert callback.wait()
    (run,) = _runs(experiment)
    run_id = run.info.run_id
    assert metric_history(run_id, "profile/train/steps") == [(3, 2.0)]
    assert metric_history(run_id, "profile/evaluate/steps") == [(2, 2.0)]  # once (repeat=1)
    assert [step for step, _ in metric_history(run_id, "eval_loss")] == [4, 5]


def test_an_exception_in_training_propagates_and_the_window_is_kept(experiment, tmp_path) -> None:
    class Failing(Trainer):
        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self.state.global_step == 2:
                raise Boom("bad batch at step 2")
            return super().training_step(*args, **kwargs)

    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=4), backend="cpu", strict=False
    )
    trainer = _trainer([callback], tmp_path, trainer_class=Failing, max_steps=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        with pytest.raises(Boom, match="bad batch at step 2") as raised:
            trainer.train()
        assert type(raised.value) is Boom  # unchanged
        callback.close()  # Transformers calls no callback when train() raises
    wait_handled("neuron_mlflow_traces")
    (record,) = list(Spool("neuron_mlflow_traces").windows())
    assert record.status == "incomplete"
    assert record.artifact_path == "profile/train/step_000001-000002"
    assert list((record.artifacts_dir / "traces" / "rank_0").glob("*.pt.trace.json.gz"))


def test_bad_stage_is_a_one_line_config_error() -> None:
    with pytest.raises(nm.ConfigError) as raised:
        nm.HfProfilerCallback(stages=("nope",), backend="cpu")
    message = str(raised.value)
    assert "\n" not in message
    assert "unknown ['nope']" in message and "allowed: train, evaluate" in message


class _Look(TrainerCallback):
    """After the profiler's hooks of each step: what of ours runs now."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen.look()


def test_train_leaves_nothing_running(experiment, tmp_path, monkeypatch) -> None:
    seen = Seen()
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=3), backend="cpu", poll_s=POLL_S
    )  # steps 1-3: open when step 2 ends
    trainer = _trainer([callback, _Look(seen)], tmp_path, max_steps=6)
    with nothing_left_behind(seen, monkeypatch):
        trainer.train()
    assert callback.wait()
    (run,) = _runs(experiment)
    assert metric_history(run.info.run_id, "profile/train/steps") == [(4, 3.0)]


def test_train_that_raised_leaves_nothing_running_once_closed(
    experiment, tmp_path, monkeypatch
) -> None:
    class Failing(Trainer):
        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self.state.global_step == 3:
                raise Boom("batch 3 failed")
            return super().training_step(*args, **kwargs)

    seen = Seen()
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=3), backend="cpu", poll_s=POLL_S, strict=False
    )
    trainer = _trainer([callback, _Look(seen)], tmp_path, trainer_class=Failing, max_steps=6)
    with nothing_left_behind(seen, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        with pytest.raises(Boom, match="batch 3 failed"):
            trainer.train()
        callback.close()
    assert callback.wait()  # the incomplete window is kept, not uploaded


@pytest.mark.slow
def test_two_ranks_under_torchrun_log_into_the_mlflow_callbacks_run(tracking_uri, tmp_path) -> None:
    experiment = "hf-torchrun"
    out = run_python(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "tests" / "hf_ddp_job.py"), str(tmp_path / "out"), str(tmp_path / "spool")],
        tracking_uri,
        cwd=tmp_path,
        MLFLOW_EXPERIMENT_NAME=experiment,
    )  # fmt: skip
    run_ids = {line.split("RUN_ID=")[1] for line in out.splitlines() if "RUN_ID=" in line}
    assert len(run_ids) == 1, out  # both ranks: rank 0's run, broadcast at train begin
    (run,) = _runs(experiment)  # Transformers' own run (rank 0's MLflowCallback), no other
    run_id = run.info.run_id
    assert run_ids == {run_id}
    assert "loss" in metrics(run_id)
    assert metric_history(run_id, "profile/train/steps") == [(3, 2.0)]
    for rank in (0, 1):  # each rank's own worker
        assert metric_history(run_id, f"profile/train/rank/{rank}/cpu_time_us")[0][0] == 3
    files = artifact_files(run_id)
    for rank in (0, 1):
        assert any(f.startswith(f"profile/train/step_000001-000002/traces/rank_{rank}/")
                   for f in files)  # fmt: skip
    assert run.data.tags["neuron_mlflow.world_size"] == "2"


def test_the_heartbeat_follows_the_training_steps(experiment, tmp_path) -> None:
    """`neuron-mlflow capture` picks a request's start from the heartbeat's step and rate:
    they follow the Trainer's steps (they stayed at the first step, so a request went to a
    past step and was refused)."""
    import json
    import time

    class Slow(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.05)

    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(skip_first=10**6), backend="cpu", poll_s=0.05
    )  # no window: only the watcher
    trainer = _trainer([callback, Slow()], tmp_path, max_steps=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)  # (the plan: no window)
        trainer.train()
    (run,) = _runs(experiment)
    beat = json.loads(run.data.tags["neuron_mlflow.capture.heartbeat.rank.0"])
    assert beat["step"] >= 15, beat
    assert metric_history(run.info.run_id, "system/step_time_s"), "rank 0 logs its step time"
