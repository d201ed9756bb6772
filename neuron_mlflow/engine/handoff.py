"""Handing a spooled window to the background worker, and publishing what it finishes.

The session calls :func:`hand_off` once a window is in the spool: the worker summarises it
(``summary`` and ``records`` wait for that only) and then uploads it (``run_id`` waits for
that too), each job bounded by ``upload_timeout_s`` at exit.

Example:
    >>> from neuron_mlflow.engine.finish import Results
    >>> Results().wait(1.0, strict=True)
    True
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.finish import FinishJob, Results, finish_window
from neuron_mlflow.engine.upload import RunTarget, upload_window
from neuron_mlflow.engine.worker import worker
from neuron_mlflow.sinks.mlflow_sink import JOB_TAG
from neuron_mlflow.sinks.spool import WindowRecord


def hand_off(
    results: Results, job: FinishJob, folder: str, config: ProfilerConfig, inline: bool
) -> Future[WindowRecord | None]:
    """Finish ``job`` on the worker (or here when ``inline``); its results go to ``results``.

    Returns:
        The future of the spooled record.
    """
    if inline:
        future: Future[WindowRecord | None] = Future()
        future.set_result(results.publish(finish_window(job)))
        return future
    summarised: Future[None] = Future()

    def summary_ready(result: Any) -> None:
        results.publish(result)
        summarised.set_result(None)

    def finish() -> WindowRecord | None:
        try:
            return results.publish(finish_window(job, on_summary=summary_ready))
        finally:
            if not summarised.done():
                summarised.set_result(None)

    return results.track(
        worker().submit(finish, folder=folder, timeout_s=config.upload_timeout_s), summarised
    )


def hand_off_upload(
    results: Results,
    record: WindowRecord,
    target: RunTarget,
    config: ProfilerConfig,
    job_id: str | None,
    folder: str,
) -> Future[str | None]:
    """Upload an already summarised spool record (per-rank metrics) on the worker."""
    tags = {JOB_TAG: job_id} if job_id else {}
    done: Future[None] = Future()
    done.set_result(None)  # nothing to summarise: `summary` never waits for it

    def upload() -> str | None:
        try:
            return upload_window(record, target, config, tags, None)
        finally:
            record.release()  # sync may take it from here

    return results.track(
        worker().submit(upload, folder=folder, timeout_s=config.upload_timeout_s), done
    )
