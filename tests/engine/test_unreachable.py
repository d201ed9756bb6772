"""A sick tracking server (accepts and never answers; answers 503) never stalls the job.

The windows wait in the spool; a later `neuron-mlflow sync` against a real server uploads each
metric value exactly once.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.sinks import reachability
from neuron_mlflow.sinks.spool import Spool
from tests.helpers import inputs, rmsnorm_naive, spooled_places
from tests.sinks.stubs import hanging_server, unavailable_server

SCHEDULE = nm.Schedule(warmup=1, active=2, repeat=3)  # 3 windows in 9 steps
STUBS = {"never-answers": hanging_server, "answers-503": unavailable_server}


@pytest.fixture(autouse=True)
def _fresh_reachability():
    reachability.forget()
    yield
    reachability.forget()


def _sync_exactly_once(monkeypatch, spool, server: str, key: str) -> None:
    """Sync the spool to ``server``; every window's ``key`` arrives once, and so does every
    other metric (a second sync sends nothing)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    reachability.forget()
    assert main(["sync", "--local-dir", str(spool)]) == 0
    records = [r for r in Spool(spool).windows() if r.manifest.get("kind") != "rank_metrics"]
    assert len(records) == 3 and {r.status for r in Spool(spool).windows()} == {"done"}
    (run_id,) = {r.manifest["run_id"] for r in records}
    client = MlflowClient(server)
    steps = sorted(m.step for m in client.get_metric_history(run_id, key))
    assert steps == sorted(r.manifest["metric_step"] for r in records), "once per window"
    for name in list(records[0].manifest["metrics"])[:25]:
        history = client.get_metric_history(run_id, name)
        assert len({(m.step, m.timestamp) for m in history}) == len(history), name
    assert main(["sync", "--local-dir", str(spool)]) == 0


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.mark.parametrize("stub", STUBS)
def test_a_decorated_loop_never_waits_for_a_sick_server(
    stub, tmp_path, monkeypatch, mlflow_server
) -> None:
    # the check waits long, so that the loop provably ran while our upload was stuck
    monkeypatch.setattr(reachability, "HEALTH_TIMEOUT_S", 30.0)
    spool = tmp_path / "spool"
    x, w = inputs()
    with STUBS[stub]() as server, warnings.catch_warnings():
        warnings.simplefilter("ignore", nm.NeuronMlflowWarning)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        profiled = nm.profile(backend="cpu", strict=False, schedule=SCHEDULE, local_dir=spool)(
            rmsnorm_naive
        )
        results = [profiled(x, w) for _ in range(9)]
        assert all(torch.equal(r, rmsnorm_naive(x, w)) for r in results)
        assert len(spooled_places(spool)) == 3, "every window is in the spool"
        if stub == "never-answers":
            _wait_for(lambda: server.connections >= 1)
            handled = [r.manifest.get("handled") for r in Spool(spool).windows()]
            assert not all(handled), "the loop finished while the worker's upload waits"
    profiled.profiler.close()
    profiled.profiler.wait()  # (close hands the windows over; the worker then gives up on them)
    assert {r.status for r in Spool(spool).windows()} == {"pending"}
    _sync_exactly_once(monkeypatch, spool, mlflow_server, "profile/op_calls")


@pytest.mark.parametrize("stub", STUBS)
def test_a_trainer_fit_never_waits_for_a_sick_server(
    stub, tmp_path, monkeypatch, mlflow_server
) -> None:
    spool = tmp_path / "spool"
    with STUBS[stub]() as server, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        callback = nm.NeuronProfilerCallback(
            backend="cpu", strict=False, schedule=SCHEDULE, local_dir=spool
        )
        trainer = Trainer(
            max_steps=9, callbacks=[callback], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
            accelerator="cpu",
        )  # fmt: skip
        trainer.fit(BoringModel())
        callback.wait()  # until the worker gave up on the sick server (fit did not wait)
        windows = [r for r in Spool(spool).windows() if r.manifest.get("kind") != "rank_metrics"]
        assert len(windows) == 3, "every window is in the spool"
    _wait_for(lambda: all(r.manifest.get("handled") for r in Spool(spool).windows()))
    _sync_exactly_once(monkeypatch, spool, mlflow_server, "profile/train/steps")


def test_an_upload_that_failed_is_one_warning_at_the_users_line(tmp_path) -> None:
    """Without logging configured, the report is printed once (the warning, not also the log
    record), and it points at the user's line that waited, not at our code."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        "import neuron_mlflow as nm\n"
        f"with nm.profile(backend='cpu', local_dir={str(tmp_path / 'spool')!r},\n"
        "                schedule=nm.Schedule(warmup=1, active=2)) as prof:\n"
        "    for _ in range(4):\n"
        "        _ = torch.ones(8) * 2\n"
        "        prof.step()\n"
        "print('run', prof.run_id)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("could not log the profiling window") == 1, done.stderr[-3000:]
    assert f"{script}:8: NeuronMlflowWarning" in done.stderr, done.stderr[-3000:]
