"""Two DDP processes on CPU (gloo): both ranks' traces land in the one run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import artifact_files, metric_history

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_ranks_log_into_one_run(tracking_uri, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "ddp_job.py"),
            tracking_uri,
            "cb-ddp",
            str(tmp_path / "spool"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_id,) = [line[7:] for line in result.stdout.splitlines() if line.startswith("RUN_ID=")]
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("cb-ddp")
    assert len(client.search_runs([experiment.experiment_id])) == 1, "one run for both ranks"
    files = artifact_files(run_id)
    folder = "profile/train/step_000002-000003"
    for rank in (0, 1):
        assert any(f.startswith(f"{folder}/traces/rank_{rank}/") for f in files), rank
    assert f"{folder}/summary.json" in files
    data = client.get_run(run_id).data
    for rank in (0, 1):
        assert data.metrics[f"profile/train/rank/{rank}/cpu_time_us"] > 0
        assert data.metrics[f"profile/train/rank/{rank}/wall_time_us"] > 0
    assert data.tags["neuron_mlflow.world_size"] == "2"
    assert metric_history(run_id, "profile/train/steps") == [(4, 2.0)]
    # both ranks spooled their window under the same local folder, apart by host and pid
    spooled = sorted((tmp_path / "spool").rglob("manifest.json"))
    assert len(spooled) == 2
