"""The MLflow sink: resolve the run, upload a spooled window, and sync pending windows.

Everything goes through :class:`mlflow.MlflowClient`: metrics in ``log_batch`` calls of at
most 1000, params and tags in calls of at most 100, artifacts with ``log_artifacts``.
Each part is marked in the window's manifest as soon as it is logged, so a retry (``neuron-mlflow
sync``) never logs a part twice.

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

import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from neuron_mlflow.sinks.spool import Spool, WindowRecord

if TYPE_CHECKING:
    from mlflow import MlflowClient

METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
TAGS_PER_CALL = 100

T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of ``items`` of at most ``size`` elements.

    Example:
        >>> [len(c) for c in chunks(list(range(2005)), 1000)]
        [1000, 1000, 5]
    """
    for start in range(0, len(items), size):
        yield items[start : start + size]


def current_tracking_uri() -> str:
    """What MLflow resolves: ``MLFLOW_TRACKING_URI``, else its default local store.

    Example:
        >>> isinstance(current_tracking_uri(), str)
        True
    """
    import mlflow

    return mlflow.get_tracking_uri()


def active_run_id() -> str | None:
    """The id of the active MLflow run of this thread, if any.

    Example:
        >>> active_run_id() is None
        True
    """
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


class MlflowSink:
    """Logs spooled windows to one tracking server through ``MlflowClient``.

    Args:
        tracking_uri: the tracking URI; ``None`` means what MLflow resolves now.
    """

    def __init__(self, tracking_uri: str | None = None) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri or current_tracking_uri()
        self.client: MlflowClient = MlflowClient(tracking_uri=self.tracking_uri)

    def check_reachable(self, timeout_s: float = 3.0) -> None:
        """For an HTTP(S) tracking URI, fail fast when nothing listens at its address.

        MLflow's client retries an unreachable server for minutes; a profiled job should not
        stall that long. Other URIs (SQLite, files, databricks) are not checked.

        Raises:
            ConnectionError: nothing accepts connections at the server's address.
        """
        from urllib.parse import urlsplit

        parts = urlsplit(self.tracking_uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
        except OSError as exc:
            raise ConnectionError(
                f"cannot connect to the MLflow tracking server at {self.tracking_uri} "
                f"({exc.strerror or exc})"
            ) from exc

    def experiment_id(self, experiment_name: str | None) -> str:
        """The id of ``experiment_name`` (created if missing), else MLflow's current default.

        The default follows ``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_EXPERIMENT_ID`` and
        ``mlflow.set_experiment``; without them it is experiment ``0``.
        """
        if experiment_name:
            experiment = self.client.get_experiment_by_name(experiment_name)
            if experiment is not None:
                return experiment.experiment_id
            return self.client.create_experiment(experiment_name)
        from mlflow.tracking.fluent import _get_experiment_id

        return _get_experiment_id() or "0"

    def create_run(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Create a run (finished at once; later windows may still log into it)."""
        run = self.client.create_run(
            self.experiment_id(experiment_name), run_name=run_name, tags=tags or {}
        )
        self.client.set_terminated(run.info.run_id)
        return run.info.run_id

    def run_exists(self, run_id: str) -> bool:
        """True when ``run_id`` exists on this server and is not deleted."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage != "deleted"

    def upload(self, record: WindowRecord, run_id: str) -> None:
        """Log one window's tags, params, metrics and artifacts into ``run_id``; mark it done.

        Parts already marked uploaded in the manifest are skipped.

        Raises:
            mlflow.exceptions.MlflowException: MLflow refused a call (the record stays pending).
            Exception: the server could not be reached (the record stays pending).
        """
        from mlflow.entities import Metric, Param, RunTag

        record.update(run_id=run_id)
        manifest = record.manifest
        if manifest.get("traces_only"):
            for part in ("tags", "params", "metrics"):
                record.manifest["uploaded"][part] = True
        if not record.is_uploaded("tags"):
            tags = [RunTag(k, str(v)) for k, v in sorted(manifest.get("tags", {}).items())]
            for batch in chunks(tags, TAGS_PER_CALL):
                self.client.log_batch(run_id, tags=batch, synchronous=True)
            record.mark_uploaded("tags")
        if not record.is_uploaded("params"):
            params = [Param(k, str(v)) for k, v in sorted(manifest.get("params", {}).items())]
            for batch in chunks(params, PARAMS_PER_CALL):
                self.client.log_batch(run_id, params=batch, synchronous=True)
            record.mark_uploaded("params")
        if not record.is_uploaded("metrics"):
            timestamp = int(time.time() * 1000)
            step = int(manifest.get("metric_step", 0))
            metrics = [
                Metric(key, float(value), timestamp, step)
                for key, value in manifest.get("metrics", {}).items()
            ]
            for batch in chunks(metrics, METRICS_PER_CALL):
                self.client.log_batch(run_id, metrics=batch, synchronous=True)
            record.mark_uploaded("metrics")
        if not record.is_uploaded("artifacts"):
            self._log_artifacts(record, run_id)
            record.mark_uploaded("artifacts")
        record.update(status="done", error=None)

    def _log_artifacts(self, record: WindowRecord, run_id: str) -> None:
        """Upload the window folder; without ``upload_traces``, everything but ``traces/``."""
        root, path = record.artifacts_dir, record.artifact_path
        if record.manifest.get("traces_only"):
            if (root / "traces").is_dir():
                self.client.log_artifacts(run_id, str(root / "traces"), f"{path}/traces")
            return
        if record.manifest.get("upload_traces", True):
            self.client.log_artifacts(run_id, str(root), path)
            return
        for child in sorted(root.iterdir()):
            if child.name == "traces":
                continue
            if child.is_dir():
                self.client.log_artifacts(run_id, str(child), f"{path}/{child.name}")
            else:
                self.client.log_artifact(run_id, str(child), path)


@dataclass
class SyncReport:
    """What :func:`sync_pending` did.

    Attributes:
        uploaded: windows uploaded now, as ``(window folder, run id)``.
        failed: windows that could not be uploaded, as ``(window folder, error)``.
        skipped: incomplete windows left alone (pass ``include_incomplete``).
    """

    uploaded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def sync_pending(
    local_dir: str,
    tracking_uri: str | None = None,
    include_incomplete: bool = False,
) -> SyncReport:
    """Upload every pending window of the spool at ``local_dir`` and mark it done.

    Each window goes into its original run when that run exists on the tracking server,
    else into a new run (one per original run or session, in the window's experiment).
    Windows already done are never uploaded again.

    Args:
        local_dir: the spool folder (``ProfilerConfig.local_dir``).
        tracking_uri: target server; ``None`` means what MLflow resolves now.
        include_incomplete: also upload windows interrupted by an exception.

    Returns:
        A :class:`SyncReport`.
    """
    spool = Spool(local_dir)
    report = SyncReport()
    records = []
    for record in spool.windows("pending", "incomplete"):  # one pass over the manifests
        if record.status == "pending" or include_incomplete:
            records.append(record)
        else:
            report.skipped.append(str(record.path))
    if not records:
        return report
    sink = MlflowSink(tracking_uri)
    sink.check_reachable()
    replacements: dict[str, str] = {}
    for record in records:
        try:
            original = record.manifest.get("run_id")
            group = original or f"session:{record.manifest.get('session')}"
            run_id = replacements.get(group)
            if run_id is None:
                if original and sink.run_exists(original):
                    run_id = original
                else:
                    run_id = sink.create_run(
                        record.manifest.get("experiment_name"),
                        record.manifest.get("run_name"),
                        tags=record.manifest.get("tags"),
                    )
                    record.update(original_run_id=original)
                replacements[group] = run_id
            sink.upload(record, run_id)
            report.uploaded.append((str(record.path), run_id))
        except Exception as exc:
            record.update(error=f"{type(exc).__name__}: {exc}")
            report.failed.append((str(record.path), f"{type(exc).__name__}: {exc}"))
    return report
