"""NeuronProfilerCallback with a real Lightning Trainer and a real MLflow store."""

from __future__ import annotations

import warnings

import mlflow
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.sinks.spool import Spool
from tests.helpers import artifact_files, metric_history, metrics, wait_handled


def _trainer(callback, logger=False, **kwargs) -> Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "callbacks": [callback, *kwargs.pop("callbacks", [])],
        "logger": logger,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    options.update(kwargs)
    return Trainer(**options)


def _logger(tracking_uri: str, experiment: str, **kwargs) -> MLFlowLogger:
    return MLFlowLogger(experiment_name=experiment, tracking_uri=tracking_uri, **kwargs)


def test_train_and_validate_windows_land_in_the_loggers_run(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-train-validate")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=1, warmup=1, active=2),
        stages=("train", "validate"),
        backend="cpu",
        top_k=100,
    )
    trainer = _trainer(callback, logger, max_steps=8, limit_val_batches=6, val_check_interval=8)
    trainer.fit(BoringModel())
    assert callback.wait()  # fit returned without waiting for the worker's uploads

    run_id = logger.run_id
    assert callback.run_id == run_id
    experiment = MlflowClient().get_experiment_by_name("cb-train-validate")
    assert len(MlflowClient().search_runs([experiment.experiment_id])) == 1, "no second run"
    got = metrics(run_id)
    # train: optimizer steps 2-3 profiled; metric step is trainer.global_step when logged
    assert metric_history(run_id, "profile/train/steps") == [(4, 2.0)]
    assert got["profile/train/op_calls"] > 0 and got["profile/train/cpu_time_us"] > 0
    assert got["profile/train/op/aten.linear/calls"] == 1
    assert "profile/train/device_time_us" not in got
    # validate: batches 2-3 of the validation run; metric step is the batch index
    assert metric_history(run_id, "profile/validate/steps") == [(3, 2.0)]
    assert got["profile/train/rank/0/cpu_time_us"] == pytest.approx(
        got["profile/train/cpu_time_us"]
    )
    assert "profile/validate/rank/0/wall_time_us" in got
    files = artifact_files(run_id)
    for folder in ("profile/train/step_000002-000003", "profile/validate/step_000002-000003"):
        assert f"{folder}/summary.md" in files
        assert any(f.startswith(f"{folder}/traces/rank_0/") for f in files)
    assert callback.summaries["train"].steps == 2


def test_sanity_check_is_never_profiled(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-sanity")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=0, active=1), stages=("validate",), backend="cpu"
    )
    trainer = _trainer(
        callback, logger, max_steps=2, num_sanity_val_steps=2, check_val_every_n_epoch=50
    )
    trainer.fit(BoringModel())
    assert callback.wait()
    assert not any(k.startswith("profile/validate") for k in metrics(logger.run_id))
    assert list(Spool("neuron_mlflow_traces").windows()) == []


def test_gradient_accumulation_counts_one_step_per_optimizer_step(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-accumulate")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=0, active=2), backend="cpu", top_k=100
    )
    trainer = _trainer(
        callback, logger, max_steps=3, accumulate_grad_batches=3, limit_val_batches=0
    )
    trainer.fit(BoringModel())
    assert callback.wait()
    got = metrics(logger.run_id)
    assert got["profile/train/steps"] == 2
    assert got["profile/train/op/aten.linear/calls"] == 3  # three micro-batches per step
    assert metric_history(logger.run_id, "profile/train/steps") == [(2, 2.0)]
    assert "profile/train/step_000000-000001/summary.json" in artifact_files(logger.run_id)


def test_repeat_gives_two_windows(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-repeat")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=2, warmup=1, active=1, repeat=2), backend="cpu"
    )
    trainer = _trainer(callback, logger, max_steps=10, limit_val_batches=0)
    trainer.fit(BoringModel())
    assert callback.wait()
    assert metric_history(logger.run_id, "profile/train/steps") == [(4, 1.0), (8, 1.0)]
    folders = {f.split("/")[2] for f in artifact_files(logger.run_id)}
    assert folders == {"step_000003-000003", "step_000007-000007"}


def test_resume_from_checkpoint_does_not_log_a_window_again(tracking_uri, tmp_path) -> None:
    logger = _logger(tracking_uri, "cb-resume")
    schedule = nm.Schedule(warmup=0, active=2)
    first = nm.NeuronProfilerCallback(schedule=schedule, stages=("validate",), backend="cpu")
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = _trainer(
        first,
        logger,
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=3,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    trainer.fit(BoringModel())
    assert first.wait()
    assert metric_history(logger.run_id, "profile/validate/steps") == [(1, 2.0)]

    resumed_logger = _logger(tracking_uri, "cb-resume", run_id=logger.run_id)
    second = nm.NeuronProfilerCallback(schedule=schedule, stages=("validate",), backend="cpu")
    trainer = _trainer(
        second, resumed_logger, max_epochs=2, limit_train_batches=4, limit_val_batches=3
    )
    trainer.fit(BoringModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert second.wait()
    assert second.state_dict()["done"]["validate"] == [0]
    assert metric_history(logger.run_id, "profile/validate/steps") == [(1, 2.0)], "no duplicate"


def test_a_logged_validation_window_is_not_profiled_again_in_a_later_run(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-no-resume-state")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=0, active=2, repeat=2), stages=("validate",), backend="cpu"
    )
    trainer = _trainer(callback, logger, max_epochs=2, limit_train_batches=2, limit_val_batches=2)
    trainer.fit(BoringModel())
    assert callback.wait()
    # window 0 in the first validation run, window 1 in the second (window 0 is done)
    assert metric_history(logger.run_id, "profile/validate/steps") == [(1, 2.0)]
    assert callback.state_dict()["done"]["validate"] == [0]


def test_exception_in_training_step_mid_window(tracking_uri, tmp_path) -> None:
    class Boom(RuntimeError):
        pass

    class Failing(BoringModel):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 2:
                raise Boom("bad batch at step 2")
            return super().training_step(batch, batch_idx)

    logger = _logger(tracking_uri, "cb-exception")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=4), backend="cpu", strict=False
    )
    trainer = _trainer(callback, logger, max_steps=10, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        with pytest.raises(Boom, match="bad batch at step 2"):
            trainer.fit(Failing())
    wait_handled("neuron_mlflow_traces")  # summarised by the worker process
    (record,) = list(Spool("neuron_mlflow_traces").windows())
    assert record.status == "incomplete"
    assert record.artifact_path == "profile/train/step_000001-000002"
    assert list((record.artifacts_dir / "traces" / "rank_0").glob("*.pt.trace.json.gz"))
    assert not any(k.startswith("profile/train/op_calls") for k in metrics(logger.run_id))


def test_without_mlflow_logger_a_new_run_is_created(tracking_uri) -> None:
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=0, active=1), backend="cpu", experiment_name="cb-no-logger"
    )
    trainer = _trainer(callback, logger=False, max_steps=2, limit_val_batches=0)
    trainer.fit(BoringModel())
    assert callback.wait()
    run = MlflowClient().get_run(callback.run_id)
    assert MlflowClient().get_experiment(run.info.experiment_id).name == "cb-no-logger"
    assert run.data.metrics["profile/train/steps"] == 1


def test_an_active_run_is_used_without_a_logger(tracking_uri) -> None:
    callback = nm.NeuronProfilerCallback(schedule=nm.Schedule(warmup=0, active=1), backend="cpu")
    with mlflow.start_run() as run:
        _trainer(callback, logger=False, max_steps=2, limit_val_batches=0).fit(BoringModel())
    assert callback.wait()
    assert callback.run_id == run.info.run_id
    assert metrics(run.info.run_id)["profile/train/steps"] == 1


def test_test_and_predict_stages(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-test-predict")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2), stages=("test", "predict"), backend="cpu"
    )
    trainer = _trainer(callback, logger, limit_test_batches=5, limit_predict_batches=5)
    model = BoringModel()
    trainer.test(model)
    trainer.predict(model)
    assert callback.wait()  # both Trainer calls' windows (each call's sessions closed)
    assert metric_history(logger.run_id, "profile/test/steps") == [(2, 2.0)]
    assert metric_history(logger.run_id, "profile/predict/steps") == [(2, 2.0)]


def test_window_cut_short_by_the_end_of_a_stage_is_partial(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-partial")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=1, warmup=1, active=5), backend="cpu"
    )
    trainer = _trainer(callback, logger, max_steps=4, limit_val_batches=0)
    with pytest.warns(nm.NeuronMlflowWarning, match=r"needs steps up to 6.*plans 4 steps"):
        trainer.fit(BoringModel())
    assert callback.wait()
    assert metric_history(logger.run_id, "profile/train/steps") == [(4, 2.0)]
    tags = MlflowClient().get_run(logger.run_id).data.tags
    assert tags["neuron_mlflow.partial/profile/train/step_000002-000003"] == "true"


def test_bad_arguments_are_rejected_with_what_is_allowed() -> None:
    with pytest.raises(nm.ConfigError, match=r"unknown \['training'\]; allowed: train, validate"):
        nm.NeuronProfilerCallback(stages=("training",))
    with pytest.raises(nm.ConfigError, match="invalid ranks"):
        nm.NeuronProfilerCallback(ranks=[-1])
    with pytest.raises(nm.ConfigError, match="top_k: got -1"):
        nm.NeuronProfilerCallback(top_k=-1)


def test_ranks_not_selected_do_not_capture(tracking_uri) -> None:
    logger = _logger(tracking_uri, "cb-ranks")
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=0, active=1), backend="cpu", ranks=[1]
    )
    _trainer(callback, logger, max_steps=2, limit_val_batches=0).fit(BoringModel())
    assert callback.wait()  # nothing to wait for: this rank captured nothing
    assert not any(k.startswith("profile/train") for k in metrics(logger.run_id))
    assert list(Spool("neuron_mlflow_traces").windows()) == []


def test_every_hook_in_the_stage_table_is_a_lightning_hook_the_callback_defines() -> None:
    from lightning.pytorch import Callback

    from neuron_mlflow.integrations.stage_table import STAGE_HOOKS

    for row in STAGE_HOOKS:
        for hook in (row.start, row.batch_start, row.batch_end, row.end):
            assert hasattr(Callback, hook), f"{hook} is not a Lightning hook"
            assert hook in vars(nm.NeuronProfilerCallback), f"the callback lacks {hook}"
        assert hasattr(Trainer, row.planned), f"Trainer has no {row.planned}"
