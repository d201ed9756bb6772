"""The MLflow sink: choose a window's run, in one place (:meth:`MlflowSink.run_for`), and
upload the window through :class:`mlflow.MlflowClient`, exactly once per value
(:mod:`neuron_mlflow.sinks.delivery`), with MLflow's HTTP retries bounded.

Example:
    >>> import tempfile, mlflow
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> uri = f"sqlite:///{tempfile.mkdtemp()}/mlflow.db"
    >>> spool = Spool(tempfile.mkdtemp())
    >>> record = spool.create_window(spool.new_session_dir(), "profile/step_000000-000000",
    ...                              metrics={"profile/steps": 1.0}, metric_step=0,
    ...                              params={}, tags={})
    >>> sink = MlflowSink(uri)
    >>> run_id = sink.create_run(experiment_name="doc")
    >>> sink.upload(record, run_id)
    >>> sink.client.get_run(run_id).data.metrics
    {'profile/steps': 1.0}
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from neuron_mlflow.naming import JOB_TAG
from neuron_mlflow.sinks import delivery, reachability
from neuron_mlflow.sinks.spool import WindowRecord

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["MlflowSink", "group_key"]


def group_key(record: WindowRecord) -> str:
    """Windows of one group go into one run: the job, else the original run, else the session."""
    window = record.window
    if window.job_id:
        return f"job:{window.job_id}"
    if window.run_id:
        return f"run:{window.run_id}"
    return f"session:{window.session}"


class MlflowSink:
    """Logs spooled windows to one tracking server through ``MlflowClient``.

    Args:
        tracking_uri: the tracking URI; ``None`` means what MLflow resolves now.
    """

    def __init__(self, tracking_uri: str | None = None) -> None:
        import mlflow
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri or mlflow.get_tracking_uri()
        self.client: MlflowClient = MlflowClient(tracking_uri=self.tracking_uri)
        self._runs: dict[str, delivery.RunState] = {}
        self._chosen: dict[str, str] = {}  # the run chosen per group (:func:`group_key`)

    def run_for(self, records: list[WindowRecord], verify: bool = False) -> str:
        """The run a group of windows (one :func:`group_key`) goes into, chosen once per
        group: the run the training thread knew (with ``verify``, only if it still exists),
        else the job's run, created once and found again by its tag :data:`JOB_TAG` (by
        every rank of an offline job, and by a sync started again after a crash).

        A group without a job id gets one derived from its key, written into every record
        before the run is created, so that a later ``sync`` finds the same run. A window
        whose run was gone keeps it as ``original_run_id``.
        """
        key = group_key(records[0])
        first = records[0].window
        known = next((r.window.run_id for r in records if r.window.run_id), None)
        if known and (not verify or self.run_exists(known)):
            return str(known)
        if key in self._chosen:
            return self._chosen[key]
        job_id = first.job_id
        if not job_id:
            job_id = f"sync-{uuid.uuid5(uuid.NAMESPACE_URL, key).hex}"
            for record in records:
                record.update(job_id=job_id)
        experiment_id = self.experiment_id(first.experiment_name, first.experiment_id)
        with reachability.bounded_http():
            found = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{job_id}'", max_results=1
            )
        if found:
            run_id = str(found[0].info.run_id)
        else:
            owner = next((r for r in records if not r.window.traces_only), records[0])
            tags = {**owner.window.tags, JOB_TAG: job_id}
            run_id = self.create_run(None, first.run_name, tags, experiment_id)
        for record in records:
            if record.window.run_id not in (None, run_id):
                record.update(original_run_id=record.window.run_id)
        self._chosen[key] = run_id
        return run_id

    def check_reachable(self) -> None:
        """Fail fast (``ConnectionError``, naming the URI and why) unless the tracking server
        answers (:func:`~neuron_mlflow.sinks.reachability.check_reachable`: short, cached)."""
        reachability.check_reachable(self.tracking_uri)

    def experiment_id(self, experiment_name: str | None, experiment_id: str | None = None) -> str:
        """The id of ``experiment_name`` (created if missing), else ``experiment_id``, else
        MLflow's current default (``MLFLOW_EXPERIMENT_NAME``/``_ID``, ``set_experiment``, 0)."""
        if experiment_name:
            with reachability.bounded_http():
                experiment = self.client.get_experiment_by_name(experiment_name)
                if experiment is not None:
                    return experiment.experiment_id
                return self.client.create_experiment(experiment_name)
        if experiment_id:
            return experiment_id
        from mlflow.tracking.fluent import _get_experiment_id

        return _get_experiment_id() or "0"

    def create_run(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        experiment_id: str | None = None,
        running: bool = False,
    ) -> str:
        """Create a run in ``experiment_name``, else ``experiment_id`` (the one the training
        process set), else MLflow's default: finished at once (later windows may still log
        into it), unless ``running`` (its creator ends it)."""
        experiment_id = self.experiment_id(experiment_name, experiment_id)
        with reachability.bounded_http():
            run = self.client.create_run(experiment_id, run_name=run_name, tags=tags or {})
            if not running:
                self.client.set_terminated(run.info.run_id)
        self._runs[run.info.run_id] = delivery.RunState(tags=dict(tags or {}))
        return str(run.info.run_id)

    def run_exists(self, run_id: str) -> bool:
        """True when ``run_id`` exists on this server and is not deleted."""
        from mlflow.exceptions import MlflowException

        try:
            with reachability.bounded_http():
                run = self.client.get_run(run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage != "deleted"

    def upload(self, record: WindowRecord, run_id: str) -> None:
        """Log one window into ``run_id`` exactly once: metrics, params and tags, artifacts.

        What the manifest marks as confirmed is skipped; a chunk cut short by a crash is
        looked up on the server first. The window is marked ``done`` at the end.

        Raises:
            mlflow.exceptions.MlflowException: MLflow refused a call (the record stays pending).
            Exception: the server could not be reached (the record stays pending).
        """
        window = record.window
        if window.run_id != run_id:
            record.update(run_id=run_id)
        if window.traces_only:  # its own rank metrics only; rank 0 logs the rest
            window.uploaded.tags = window.uploaded.params = True
        with reachability.bounded_http():
            delivery.send_metrics(self.client, record, run_id)
            if not (window.uploaded.params and window.uploaded.tags):
                if run_id not in self._runs:  # what the run holds already: read once
                    data = self.client.get_run(run_id).data
                    self._runs[run_id] = delivery.RunState(dict(data.params), dict(data.tags))
                delivery.send_params_and_tags(self.client, record, run_id, self._runs[run_id])
            delivery.send_artifacts(self.client, record, run_id)
        record.uploaded()
