"""Log trace files written elsewhere into MLflow, as a live window would be logged.

Example:
    >>> find_traces([Path("/nowhere")])
    Traceback (most recent call last):
    ...
    neuron_mlflow.errors.IngestError: no such file or folder: /nowhere
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_mlflow.capture.profile_reader import looks_like_trace
from neuron_mlflow.engine.environment import package_version
from neuron_mlflow.engine.pipeline import clean_up, write_files
from neuron_mlflow.errors import IngestError
from neuron_mlflow.naming import (
    busy_metric,
    rank_metrics,
    run_tag,
    trace_folder,
    window_artifact_path,
    window_metrics,
)
from neuron_mlflow.sinks.spool import ARTIFACTS, Spool, WindowRecord
from neuron_mlflow.trace.summarize import TraceResult, summarize_trace


def find_traces(paths: Sequence[Path]) -> list[Path]:
    """Trace files: each file given, and every ``.json``/``.json.gz`` trace under each folder.

    Raises:
        IngestError: a path does not exist, or no trace was found.
    """
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            candidates = sorted({*path.rglob("*.json"), *path.rglob("*.json.gz")})
            found.extend(c for c in candidates if looks_like_trace(c))
        else:
            raise IngestError(f"no such file or folder: {path}")
    if not found:
        where = ", ".join(str(path) for path in paths)
        raise IngestError(
            f"no trace files in {where}: expected torch.profiler traces (*.pt.trace.json[.gz]) "
            "or Neuron profiles (their trace.json), any .json/.json.gz holding traceEvents"
        )
    return found


def _ranks(results: list[tuple[Path, TraceResult]]) -> dict[int, tuple[Path, TraceResult]]:
    """Rank from each file's ``distributedInfo``; files without one (or repeating one) get
    the next free numbers in file order."""
    by_rank: dict[int, tuple[Path, TraceResult]] = {}
    pending = []
    for path, result in results:
        if result.rank is not None and result.rank not in by_rank:
            by_rank[result.rank] = (path, result)
        else:
            pending.append((path, result))
    free = (rank for rank in itertools.count() if rank not in by_rank)
    for item in pending:
        by_rank[next(free)] = item
    return dict(sorted(by_rank.items()))


def spool_traces(
    paths: list[Path], prefix: str, local_dir: Path, top_k: int = 20
) -> tuple[WindowRecord, dict[int, tuple[Path, TraceResult]]]:
    """Summarise the traces and write one window into the spool (pending upload); its
    metrics and files: docs/cli.md, ``ingest``."""
    ranks = _ranks([(path, summarize_trace(path)) for path in paths])
    main_rank = next(iter(ranks))
    main = ranks[main_rank][1]
    summary = main.summary
    tags = {
        run_tag("source"): "ingest",
        run_tag("version"): package_version(),
        run_tag("world_size"): str(len(ranks)),
    }
    if summary.device_label:
        tags[run_tag("device")] = summary.device_label
    spool = Spool(local_dir.absolute())
    session_dir = spool.new_session_dir()
    staged = Spool.capture_dir(session_dir, 0)
    for rank, (path, _) in ranks.items():
        target = staged / ARTIFACTS / trace_folder(rank)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / path.name)
    counted = ("device_events", "unattributed_device_events", "device_busy_pct", "kernels")
    sources: dict[str, Any] = {
        str(rank): {"file": str(path), **{name: getattr(result, name) for name in counted}}
        for rank, (path, result) in ranks.items()
    }
    last = summary.steps - 1
    record = spool.create_window(
        session_dir, window_artifact_path(prefix, 0, last), summarised=False, staged=staged,
        claimed=True,  # until uploaded: a `sync` running meanwhile leaves it alone
        prefix=prefix, tags=tags, metric_step=last,
        window={"index": 0, "first": 0, "last": last}, sources=sources,
    )  # fmt: skip
    try:
        title = f"{prefix}: {ranks[main_rank][0].name} (rank {main_rank})"
        write_files(record, summary, top_k, {"ranks": sources}, title)
        metrics = window_metrics(summary, prefix, top_k)
        if main.device_busy_pct is not None and summary.device_time_us is not None:
            metrics[busy_metric(prefix)] = main.device_busy_pct
        for rank, (_, result) in ranks.items():
            metrics.update(rank_metrics(prefix, rank, result.summary))
        record.summarised(metrics)
    except BaseException:
        record.release()
        raise
    return record, ranks


def ingest(
    paths: list[Path], run_id: str | None, experiment: str | None, prefix: str, local_dir: Path
) -> tuple[str, WindowRecord, dict[int, tuple[Path, TraceResult]]]:
    """Spool the traces as one window and log it into ``run_id`` (or a new run); the files
    given are never touched (the spool's copy of them leaves once MLflow confirmed them).

    Raises:
        IngestError: no traces, or ``run_id`` does not exist.
        TraceFormatError: a trace is truncated or malformed.
        ConnectionError: the tracking server cannot be reached (the window stays pending).
    """
    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

    files = find_traces(paths)
    sink = MlflowSink()
    try:
        sink.check_reachable()
        reachable: ConnectionError | None = None
    except ConnectionError as exc:
        reachable = exc
    if reachable is None and run_id is not None and not sink.run_exists(run_id):
        # before anything is written: a wrong run id creates nothing (no spooled window
        # that a later sync would turn into an orphan run)
        raise IngestError(
            f"run {run_id!r} was not found at {sink.tracking_uri}; pass the id of an "
            "existing run, or leave --run-id out to create a new run"
        )
    record, ranks = spool_traces(files, prefix, local_dir)
    try:  # claimed until uploaded: a `sync` running meanwhile leaves it alone
        if run_id is not None:
            record.update(run_id=run_id)  # sync logs into it when the server is back
        if reachable is not None:
            raise ConnectionError(
                f"{reachable}; the window is kept at {record.path} (pending): "
                "`neuron-mlflow sync` uploads it later"
            ) from reachable
        target = run_id or sink.create_run(experiment, run_name="ingest", tags=record.window.tags)
        sink.upload(record, target)
        clean_up(record)  # the spool's copy of the traces (never the files given)
    finally:
        record.release()
    return target, record, ranks
