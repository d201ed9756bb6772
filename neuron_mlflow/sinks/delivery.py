"""Exactly-once delivery of one spooled window: metrics, then params and tags, then artifacts.

Progress is kept in the window's record (:class:`~neuron_mlflow.sinks.window_record.
UploadProgress`): the metric chunks (at most 1000, keys sorted) and artifact files the server
confirmed, and the chunk in flight (``sending``). After a crash that chunk is looked up on the
server (its last metric at the window's step and capture time) before it is sent again:
MLflow stores a repeated metric value twice, and ``log_batch`` is one transaction on SQL
stores.

Example:
    >>> metric_chunks({"b": 2.0, "a": 1.0}, size=1)
    [[('a', 1.0)], [('b', 2.0)]]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.naming import CONFIG_CHANGED_TAG
from neuron_mlflow.sinks.spool import WindowRecord

if TYPE_CHECKING:
    from mlflow import MlflowClient

METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
TAGS_PER_CALL = 100


@dataclass
class RunState:
    """What a run already holds of ours: its params and tags (read once, kept up to date)."""

    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def metric_chunks(metrics: dict[str, float], size: int = METRICS_PER_CALL) -> list[list[Any]]:
    """The window's metrics as ``log_batch`` chunks: keys sorted, at most ``size`` each."""
    items = sorted((k, float(v)) for k, v in metrics.items())
    return [items[i : i + size] for i in range(0, len(items), size)]


def send_metrics(client: MlflowClient, record: WindowRecord, run_id: str) -> None:
    """Send the chunks not yet confirmed; mark each in the manifest."""
    from mlflow.entities import Metric

    window = record.window
    if window.uploaded.metrics:
        return
    progress, step, ts = window.progress, window.metric_step, window.captured_ms
    for index, chunk in enumerate(metric_chunks(window.metrics)):
        if index in progress.metric_chunks:
            continue
        landed = False
        if progress.sending == index:  # cut short: look its last metric up first
            key, value = chunk[-1]
            history = client.get_metric_history(run_id, key)
            landed = any(m.step == step and m.timestamp == ts and m.value == value for m in history)
        if not landed:
            progress.sending = index
            record.save()
            metrics = [Metric(k, v, ts, step) for k, v in chunk]
            client.log_batch(run_id, metrics=metrics, synchronous=True)
        progress.metric_chunks.append(index)
        progress.sending = None
        record.save()
    record.mark_uploaded("metrics")


def send_params_and_tags(
    client: MlflowClient, record: WindowRecord, run_id: str, run: RunState
) -> None:
    """Params once per prefix and run (``run``: what the run holds already); then the tags.

    A window whose config differs from the run's params tags the run
    ``neuron_mlflow.config_changed/<prefix>`` (once: the first window that differed).
    ``run`` is updated with what was logged.
    """
    from mlflow.entities import Param, RunTag

    window = record.window
    if not window.uploaded.params:
        params = {k: str(v) for k, v in window.params.items()}
        if any(run.params.get(k, v) != v for k, v in params.items()):
            prefix = window.prefix or window.artifact_path.rsplit("/", 1)[0]
            tag = f"{CONFIG_CHANGED_TAG}/{prefix}"
            if tag not in run.tags:
                window.tags[tag] = record.artifact_path
        else:  # the first window of the prefix (or the rest of a batch cut short)
            batch = [Param(k, v) for k, v in sorted(params.items()) if k not in run.params]
            for i in range(0, len(batch), PARAMS_PER_CALL):
                client.log_batch(run_id, params=batch[i : i + PARAMS_PER_CALL], synchronous=True)
            run.params.update(params)
        record.mark_uploaded("params")  # saves the config_changed tag with it
    if not window.uploaded.tags:
        tags = {k: str(v) for k, v in window.tags.items()}
        batch_tags = [RunTag(k, v) for k, v in sorted(tags.items())]
        for i in range(0, len(batch_tags), TAGS_PER_CALL):
            client.log_batch(run_id, tags=batch_tags[i : i + TAGS_PER_CALL], synchronous=True)
        run.tags.update(tags)
        record.mark_uploaded("tags")


def artifact_files(record: WindowRecord) -> Iterator[Path]:
    """The window's files to upload, relative to its artifact folder, in a stable order.

    Without ``upload_traces``, ``traces/`` is left out; ``traces_only`` sends only it.
    """
    root, window = record.artifacts_dir, record.window
    for path in sorted(p for p in root.rglob("*") if p.is_file()):  # none: no folder
        rel = path.relative_to(root)
        in_traces = rel.parts[0] == "traces"
        if (in_traces or not window.traces_only) and (window.upload_traces or not in_traces):
            yield rel


def send_artifacts(client: MlflowClient, record: WindowRecord, run_id: str) -> None:
    """Upload the files not yet confirmed, one ``log_artifact`` each."""
    if record.window.uploaded.artifacts:
        return
    confirmed = record.window.progress.artifact_files
    done = set(confirmed)
    for rel in artifact_files(record):
        name = rel.as_posix()
        if name not in done:
            folder = "/".join([record.artifact_path, *rel.parts[:-1]])
            client.log_artifact(run_id, str(record.artifacts_dir / rel), folder)
            confirmed.append(name)
            record.save()
    record.mark_uploaded("artifacts")
