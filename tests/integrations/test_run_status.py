"""The run ``nm.autolog()`` makes has MLflow's run status: ``RUNNING`` while the job runs,
``FINISHED`` when the process exits normally, ``FAILED`` when the user's code raised, and a
SIGKILLed job leaves it ``RUNNING`` (never ``FINISHED`` before the job ended). Each job is a
real Python process against a real SQLite store, read back with ``MlflowClient``.

The run the Lightning callback makes (no logger) ends with ``fit``: ``FINISHED``, or
``FAILED`` when the training raised; no exit hook of ours is left (in-process, real store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch import Callback, Trainer
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.engine import runs
from tests.helpers import ROOT
from tests.integrations import test_nothing_left_behind as left

DEADLINE_S = 300.0  # a busy machine: a process importing torch and MLflow may take long

JOB = """
import sys, time
from pathlib import Path
import torch
import neuron_mlflow as nm
from neuron_mlflow.engine import runs
from neuron_mlflow.integrations.autolog import autolog_run_id, autolog_summary

mode = sys.argv[1]
schedule = nm.Schedule(warmup=1, active=2) if mode == "kill" else nm.Schedule(skip_first=10**9)
nm.autolog(backend="cpu", schedule=schedule, experiment_name="status-check")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
if mode == "kill":
    assert autolog_summary().steps == 2  # the window ended (summarised by the worker)
Path("run_id.tmp").write_text(autolog_run_id())
Path("run_id.tmp").rename("run_id")
deadline = time.monotonic() + 600
while not Path("go").exists() and time.monotonic() < deadline:  # the job goes on
    time.sleep(0.05)
if mode == "raise":
    raise RuntimeError("the user's own failure")
"""


@pytest.fixture
def job(tmp_path: Path, tracking_uri: str) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    (tmp_path / "job.py").write_text(JOB)
    started: list[subprocess.Popen[str]] = []
    yield tmp_path, started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(job: tuple[Path, list[subprocess.Popen[str]]], mode: str, uri: str) -> tuple:
    folder, started = job
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(
        MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT), NEURON_MLFLOW_STRICT="1",
        NEURON_MLFLOW_POLL_S="0", NEURON_MLFLOW_WORKER_IDLE_S="2",
        NEURON_MLFLOW_LOCAL_DIR=str(folder / "spool"),
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "job.py", mode], cwd=folder, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    started.append(proc)
    deadline = time.monotonic() + DEADLINE_S
    while not (folder / "run_id").exists():
        if proc.poll() is not None:
            pytest.fail(f"the job ended early ({proc.returncode}): {proc.stderr.read()[-4000:]}")
        assert time.monotonic() < deadline, "the job never reached its sleep"
        time.sleep(0.1)
    return proc, (folder / "run_id").read_text()


def _status(uri: str, run_id: str) -> tuple[str, int | None]:
    info = MlflowClient(uri).get_run(run_id).info
    return info.status, info.end_time


ENDS = [("exit", 0, "FINISHED"), ("raise", 1, "FAILED")]


@pytest.mark.parametrize(("mode", "code", "status"), ENDS)
def test_the_run_is_running_until_the_process_ends(job, tracking_uri, mode, code, status) -> None:
    proc, run_id = _start(job, mode, tracking_uri)
    assert _status(tracking_uri, run_id) == ("RUNNING", None)  # the job still runs
    (job[0] / "go").touch()
    _, stderr = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == code, stderr[-4000:]
    if mode == "raise":  # the user's exception, unchanged
        assert "RuntimeError: the user's own failure" in stderr
    run_status, end_time = _status(tracking_uri, run_id)
    assert run_status == status
    assert end_time is not None


def test_a_killed_job_leaves_its_run_running(job, tracking_uri) -> None:
    proc, run_id = _start(job, "kill", tracking_uri)  # after its window
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == -signal.SIGKILL
    assert _status(tracking_uri, run_id) == ("RUNNING", None)  # nothing of it could run


class Status(Callback):
    """The run's status while the fit runs (after the profiler's hooks of each batch)."""

    def __init__(self, callback: nm.NeuronProfilerCallback) -> None:
        self.callback, self.seen = callback, set()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen.add(MlflowClient().get_run(self.callback.run_id).info.status)


@pytest.mark.parametrize(("fail_at", "status"), [(None, "FINISHED"), (2, "FAILED")])
def test_a_fit_without_a_logger_ends_its_run(tracking_uri, monkeypatch, fail_at, status) -> None:
    seen = left.Seen()
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=3), backend="cpu", poll_s=left.POLL_S,
        experiment_name="status-fit", strict=fail_at is None,
    )  # fmt: skip
    running = Status(callback)
    trainer = Trainer(
        accelerator="cpu", devices=1, callbacks=[callback, left.Look(seen), running], logger=False,
        max_steps=6, limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with left.nothing_left_behind(seen, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        if fail_at is None:
            trainer.fit(left._model("train", None))
        else:  # the user's exception, unchanged
            with pytest.raises(left.Boom, match="batch 2 failed"):
                trainer.fit(left._model("train", fail_at))
    assert running.seen == {"RUNNING"}  # while the fit ran
    assert callback.run_id not in [run for _, run, _ in runs._owned]  # none left to the exit hook
    run_status, end_time = _status(tracking_uri, callback.run_id)
    assert run_status == status
    assert end_time is not None
    assert callback.wait()
