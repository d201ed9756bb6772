"""Two DDP processes on CPU (gloo): both ranks' traces land in the one run."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, artifact_files, metric_history, run_python


@pytest.mark.slow
def test_two_ranks_log_into_one_run(tracking_uri, tmp_path) -> None:
    out = run_python(
        [str(ROOT / "tests" / "ddp_job.py"), tracking_uri, "cb-ddp", str(tmp_path / "spool")],
        tracking_uri,
        cwd=tmp_path,
    )
    (run_id,) = [line[7:] for line in out.splitlines() if line.startswith("RUN_ID=")]
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
    windows = [p for p in spooled if p.parent.name != "ranks"]
    assert len(windows) == 2
    # rank 0's per-rank times went through its spool too (a record next to its window)
    assert [p.parent.parent.name for p in spooled if p.parent.name == "ranks"] == [
        "step_000002-000003"
    ]
