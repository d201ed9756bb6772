"""Per-rank metrics through the spool: a small record next to its window, uploaded by the worker.

The root rank's gathered per-rank times (``P/rank/<r>/...``) are never logged from the
training thread: they are written as a record of their own in the window's folder
(``<window>/ranks/manifest.json``, no artifacts) and handed to the background uploader,
which sends them after the window itself (same run, exactly once, capture-time timestamps).
An upload that fails leaves them pending for ``neuron-mlflow sync``, like any window.

Example:
    >>> import tempfile
    >>> from neuron_mlflow.config import ProfilerConfig
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> spool = Spool(tempfile.mkdtemp())
    >>> record = spool_rank_metrics(spool, spool.new_session_dir(), "profile/step_000001-000002",
    ...                             {"profile/rank/0/wall_time_us": 5.0}, 2, ProfilerConfig())
    >>> record.artifact_path, record.manifest["metrics"]
    ('profile/step_000001-000002/ranks', {'profile/rank/0/wall_time_us': 5.0})
"""

from __future__ import annotations

from pathlib import Path

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.sinks.spool import Spool, WindowRecord

RANKS_FOLDER = "ranks"


def spool_rank_metrics(
    spool: Spool,
    session_dir: Path,
    window_path: str,
    metrics: dict[str, float],
    metric_step: int,
    config: ProfilerConfig,
    run_id: str | None = None,
    job_id: str | None = None,
) -> WindowRecord:
    """Write the per-rank metrics of the window at ``window_path`` as a pending record."""
    record = spool.create_window(
        session_dir,
        f"{window_path}/{RANKS_FOLDER}",
        metrics=metrics,
        params={},
        tags={},
        metric_step=metric_step,
        experiment_name=config.experiment_name,
        run_name=config.run_name,
        run_id=run_id,
        job_id=job_id,
        kind="rank_metrics",
        summarised=True,
        claimed=True,  # until the worker has uploaded it (or at once, without an upload)
        uploaded={"tags": True, "params": True, "metrics": False, "artifacts": True},
    )
    return record
