"""SIGTERM (spot reclaim, preemption) mid-window: the window is kept as partial, sync uploads it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from neuron_mlflow.sinks.spool import Spool
from tests.conftest import free_port
from tests.helpers import ROOT


@pytest.mark.slow
def test_sigterm_mid_window_leaves_a_partial_window_that_sync_uploads(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    # the server is down during the job: the window must survive in the spool
    env.update(PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "engine" / "sigterm_job.py"), str(spool)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    output = []
    for line in proc.stdout:
        output.append(line)
        if line.startswith("STEP ") and int(line.split()[1]) >= 5:  # inside the window
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=300)  # Lightning stops the fit (its own exit code)
    output.append(rest)

    records = list(Spool(spool).windows())
    assert len(records) == 1, "".join(output)[-3000:]
    (record,) = records
    assert record.status == "pending"
    assert record.manifest["window"]["partial"] is True
    assert record.manifest["metrics"], "the window was summarised before the process ended"
    last = record.manifest["window"]["last"]
    assert 4 <= last < 500, "cut short by the signal"

    assert main(["sync", "--local-dir", str(spool)]) == 0
    (record,) = list(Spool(spool).windows())
    run = MlflowClient().get_run(record.manifest["run_id"])
    assert run.data.metrics["profile/train/steps"] >= last  # steps 1..last (+ the open one)
    assert run.data.tags[f"neuron_mlflow.partial/{record.artifact_path}"] == "true"
