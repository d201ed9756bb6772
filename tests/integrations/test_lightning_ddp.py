"""Two DDP processes on CPU (gloo): both ranks' windows land in the one run, each rank's
times logged by its own worker (no collective in any hook), rank 0's worker logs the skew;
a rank that turns profiling off, or does not capture, holds nobody."""

from __future__ import annotations

import time

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, artifact_files, metric_history, run_python

SKEW = "profile/train/rank/max_over_median_time"
WINDOWS = ("profile/train/step_000002-000003", "profile/train/step_000006-000007")


def _job(tracking_uri: str, tmp_path, experiment: str, mode: str) -> tuple[str, float]:
    started = time.monotonic()
    out = run_python(
        [str(ROOT / "tests" / "ddp_job.py"), tracking_uri, experiment,
         str(tmp_path / "spool"), mode],
        tracking_uri,
        cwd=tmp_path,
    )  # fmt: skip
    (run_id,) = [line[7:] for line in out.splitlines() if line.startswith("RUN_ID=")]
    client = MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    assert len(client.search_runs([experiment_id])) == 1, "one run for both ranks"
    return run_id, time.monotonic() - started


def _eventually(read, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := read()):
        assert time.monotonic() < deadline, "not logged in time"
        time.sleep(0.25)
    return value


@pytest.mark.slow
def test_two_ranks_log_into_one_run(tracking_uri, tmp_path) -> None:
    run_id, _ = _job(tracking_uri, tmp_path, "cb-ddp", "all")
    client = MlflowClient(tracking_uri)
    files = artifact_files(run_id)
    for folder in WINDOWS:
        for rank in (0, 1):
            assert any(f.startswith(f"{folder}/traces/rank_{rank}/") for f in files), rank
        assert f"{folder}/summary.json" in files
    for rank in (0, 1):  # each rank's own worker, one value per window
        for name in ("cpu_time_us", "wall_time_us"):
            history = metric_history(run_id, f"profile/train/rank/{rank}/{name}")
            assert [step for step, _ in history] == [4, 8], (rank, name, history)
            assert all(value > 0 for _, value in history)
    assert client.get_run(run_id).data.tags["neuron_mlflow.world_size"] == "2"
    assert metric_history(run_id, "profile/train/steps") == [(4, 2.0), (8, 2.0)]
    skew = _eventually(lambda: metric_history(run_id, SKEW))  # rank 0's worker, off the job
    assert [step for step, _ in skew] == [4, 8] and all(value >= 1.0 for _, value in skew)
    # both ranks spooled their windows under the same local folder, apart by host and pid
    assert len(sorted((tmp_path / "spool").rglob("manifest.json"))) == 4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rank1-off", "ranks0"])
def test_a_rank_that_does_not_capture_holds_nobody(tracking_uri, tmp_path, mode) -> None:
    run_id, seconds = _job(tracking_uri, tmp_path, f"cb-ddp-{mode}", mode)
    files = artifact_files(run_id)
    for folder in WINDOWS:  # rank 0's windows land, rank 1 has none
        assert f"{folder}/summary.json" in files
        assert any(f.startswith(f"{folder}/traces/rank_0/") for f in files)
        assert not any(f.startswith(f"{folder}/traces/rank_1/") for f in files)
    assert [s for s, _ in metric_history(run_id, "profile/train/rank/0/cpu_time_us")] == [4, 8]
    assert metric_history(run_id, "profile/train/rank/1/cpu_time_us") == []
    assert metric_history(run_id, "profile/train/steps") == [(4, 2.0), (8, 2.0)]
    assert seconds < 240, "the job finished (no rank waited for the one that stopped)"
