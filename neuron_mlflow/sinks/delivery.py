"""Exactly-once delivery of one spooled window: metrics, then params and tags, then artifacts.

Progress is kept in the window's record under ``progress``
(:class:`~neuron_mlflow.sinks.window_record.UploadProgress`):

- ``metric_chunks``: indexes of the ``log_batch`` chunks (at most 1000 metrics, keys sorted)
  the server confirmed; ``sending``: the chunk in flight. A chunk found ``sending`` after a
  crash is looked up on the server (its last metric at the window's step and capture time)
  before it is sent again, so a sync killed at any point never stores a value twice (MLflow
  stores a repeated metric value twice, and ``log_batch`` is one transaction on SQL stores).
- ``artifact_files``: artifact files (paths relative to the window's artifact folder) the
  server confirmed. A re-sent file would overwrite itself; recording them saves the upload.

Metrics carry the capture time of the window (``captured_ms``), not the upload time.

Params are logged once per prefix and run: a later window whose config differs from the
params already in the run is tagged ``neuron_mlflow.config_changed/<prefix>`` (value: the first
such window's artifact path) instead, and its metrics and artifacts are uploaded as usual.

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
from neuron_mlflow.sinks.window_record import Window

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


def window_prefix(window: Window) -> str:
    """The metric prefix ``P`` of a window (``P/step_<first>-<last>``)."""
    if window.prefix:
        return window.prefix
    return window.artifact_path.rsplit("/", 1)[0]


def _landed(client: MlflowClient, run_id: str, chunk: list[Any], step: int, ts: int) -> bool:
    key, value = chunk[-1]
    history = client.get_metric_history(run_id, key)
    return any(m.step == step and m.timestamp == ts and m.value == value for m in history)


def send_metrics(client: MlflowClient, record: WindowRecord, run_id: str) -> int:
    """Send the chunks not yet confirmed; mark each in the manifest. Returns requests made."""
    from mlflow.entities import Metric

    if record.is_uploaded("metrics"):
        return 0
    progress = record.window.progress
    step = record.window.metric_step
    ts = record.window.captured_ms
    requests = 0
    for index, chunk in enumerate(metric_chunks(record.window.metrics)):
        if index in progress.metric_chunks:
            continue
        if progress.sending == index:
            requests += 1
            if _landed(client, run_id, chunk, step, ts):
                progress.metric_chunks.append(index)
                progress.sending = None
                record.save()
                continue
        progress.sending = index
        record.save()
        client.log_batch(
            run_id, metrics=[Metric(k, v, ts, step) for k, v in chunk], synchronous=True
        )
        requests += 1
        progress.metric_chunks.append(index)
        progress.sending = None
        record.save()
    record.mark_uploaded("metrics")
    return requests


def send_params_and_tags(
    client: MlflowClient, record: WindowRecord, run_id: str, run: RunState
) -> int:
    """Params once per prefix and run (``run``: what the run holds already); then the tags.

    A window whose config differs from the run's params tags the run
    ``neuron_mlflow.config_changed/<prefix>`` (once: the first window that differed).
    ``run`` is updated with what was logged. Returns the requests made.
    """
    from mlflow.entities import Param, RunTag

    requests = 0
    if not record.is_uploaded("params"):
        params = {k: str(v) for k, v in record.window.params.items()}
        if any(run.params.get(k, v) != v for k, v in params.items()):
            tag = f"{CONFIG_CHANGED_TAG}/{window_prefix(record.window)}"
            if tag not in run.tags:
                record.window.tags[tag] = record.artifact_path
        else:  # the first window of the prefix (or the rest of a batch cut short)
            batch = [Param(k, v) for k, v in sorted(params.items()) if k not in run.params]
            for start in range(0, len(batch), PARAMS_PER_CALL):
                client.log_batch(
                    run_id, params=batch[start : start + PARAMS_PER_CALL], synchronous=True
                )
                requests += 1
            run.params.update(params)
        record.mark_uploaded("params")  # saves the config_changed tag with it
    if not record.is_uploaded("tags"):
        tags = {k: str(v) for k, v in record.window.tags.items()}
        batch_tags = [RunTag(k, v) for k, v in sorted(tags.items())]
        for start in range(0, len(batch_tags), TAGS_PER_CALL):
            client.log_batch(
                run_id, tags=batch_tags[start : start + TAGS_PER_CALL], synchronous=True
            )
            requests += 1
        run.tags.update(tags)
        record.mark_uploaded("tags")
    return requests


def artifact_files(record: WindowRecord) -> Iterator[Path]:
    """The window's files to upload, relative to its artifact folder, in a stable order.

    Without ``upload_traces``, ``traces/`` is left out; ``traces_only`` sends only it.
    """
    root = record.artifacts_dir
    if not root.is_dir():
        return
    traces_only = record.window.traces_only
    with_traces = record.window.upload_traces
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        in_traces = rel.parts[0] == "traces"
        if (traces_only and not in_traces) or (in_traces and not with_traces):
            continue
        yield rel


def send_artifacts(client: MlflowClient, record: WindowRecord, run_id: str) -> int:
    """Upload the files not yet confirmed, one ``log_artifact`` each. Returns requests made."""
    if record.is_uploaded("artifacts"):
        return 0
    progress = record.window.progress
    done = set(progress.artifact_files)
    requests = 0
    for rel in artifact_files(record):
        name = rel.as_posix()
        if name in done:
            continue
        folder = "/".join([record.artifact_path, *rel.parts[:-1]])
        client.log_artifact(run_id, str(record.artifacts_dir / rel), folder)
        requests += 1
        progress.artifact_files.append(name)
        record.save()
    record.mark_uploaded("artifacts")
    return requests
