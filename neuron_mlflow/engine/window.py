"""Window assembly: the one function that turns a summarised window into a spooled window.

Live windows (:class:`~neuron_mlflow.engine.session.ProfilingSession`) and ``ingest`` both
use the same two steps (:func:`assemble_window` runs both): :func:`spool_window` writes the
manifest and moves the window's staged files (the traces) into its artifact folder (cheap,
so a live window does it on the training thread); :func:`write_summary` builds the metrics
from the summary (names from :mod:`neuron_mlflow.naming`), writes the summary files and
``report.html`` next to the traces, and marks the window ``pending`` (ready to upload) or
``incomplete``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.sinks.spool import Spool
    >>> from neuron_mlflow.summary.ops import RawOp, build_summary
    >>> spool = Spool(tempfile.mkdtemp())
    >>> summary = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
    >>> record = assemble_window(spool, spool.new_session_dir(), WindowSpec(
    ...     prefix="profile", index=0, first=0, last=1, summary=summary))
    >>> record.status, record.manifest["metrics"]["profile/op_calls"]
    ('pending', 1.0)
    >>> sorted(p.name for p in record.artifacts_dir.iterdir())
    ['op_keys.json', 'ops.csv', 'report.html', 'summary.json', 'summary.md']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_mlflow.engine.guard import guarded
from neuron_mlflow.naming import busy_metric, partial_tag, window_artifact_path, window_metrics
from neuron_mlflow.sinks.spool import Spool, Status, WindowRecord, write_summary_files
from neuron_mlflow.summary.ops import OpSummary
from neuron_mlflow.trace.window_report import write_window_report


@dataclass
class WindowSpec:
    """Everything one window's folder is made of.

    Attributes:
        prefix: the metric prefix ``P``.
        index: the window's index in its schedule (0 for ``ingest``).
        first: its first recorded step; ``last`` its last.
        summary: the op summary (per step); ``None`` until summarised.
        partial: the window ended before its last scheduled step.
        top_k: how many operators get per-op metrics.
        device_busy_pct: the device's busy share, when known.
        extra_metrics: more metrics (per-rank values, ...), already named.
        params: params to log (``P/config/...``).
        tags: run tags.
        metric_step: the MLflow step of the window's metrics (default: ``last``).
        staged: a folder whose ``artifacts/`` subfolder (traces) becomes the window's
            artifact folder; it is moved, then removed.
        title: the summary table's title.
        document: more top-level entries of ``summary.json``.
        status: ``pending`` (ready to upload) or ``incomplete`` (kept, not uploaded).
        error: what went wrong, if anything (kept in the manifest).
        manifest: more manifest fields (experiment and run names, traces_only, ...).
        strict: a failure to write ``report.html`` raises (else it is a warning).
        run_id: the run the window goes to, when known before the upload (report header).
        rank_metrics: this rank's own times (``P/rank/<r>/...``) in a job of several ranks.
        traces_only: the window of a rank other than 0: its metrics are its rank metrics only
            (rank 0 logs the window's summary metrics, params and tags).
    """

    prefix: str
    index: int
    first: int
    last: int
    summary: OpSummary | None
    partial: bool = False
    top_k: int = 20
    device_busy_pct: float | None = None
    extra_metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metric_step: int | None = None
    staged: Path | None = None
    title: str | None = None
    document: dict[str, Any] = field(default_factory=dict)
    status: Status = "pending"
    error: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    strict: bool = False
    run_id: str | None = None
    rank_metrics: dict[str, float] = field(default_factory=dict)
    traces_only: bool = False

    @property
    def artifact_path(self) -> str:
        """``P/step_<first>-<last>``."""
        return window_artifact_path(self.prefix, self.first, self.last)


def window_metrics_of(spec: WindowSpec) -> dict[str, float]:
    """The window's metrics: the summary's, the busy share when there is device time, extras.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("k", 1, 1.0, 1.0, 2.0, 2.0)], 1, 1, 4.0, device_label="CUDA")
        >>> spec = WindowSpec("P", 0, 0, 0, s, device_busy_pct=50.0)
        >>> window_metrics_of(spec)["P/device_busy_pct"]
        50.0
    """
    assert spec.summary is not None, "the window has not been summarised"
    metrics = window_metrics(spec.summary, spec.prefix, spec.top_k)
    if spec.device_busy_pct is not None and spec.summary.device_time_us is not None:
        metrics[busy_metric(spec.prefix)] = spec.device_busy_pct
    metrics.update(spec.extra_metrics)
    return metrics


def spool_window(
    spool: Spool, session_dir: Path, spec: WindowSpec, claimed: bool = False
) -> WindowRecord:
    """Write the window's folder and manifest and move its staged files (traces) into it.

    Cheap (a record and a rename). Until :func:`write_summary` has run the window is in
    state ``spooled`` and holds no metrics (``sync`` summarises such a window first).
    """
    artifact_path = spec.artifact_path
    tags = dict(spec.tags)
    if spec.partial:
        tags[partial_tag(artifact_path)] = "true"
    record = spool.create_window(
        session_dir,
        artifact_path,
        status="incomplete" if spec.status == "incomplete" else "pending",
        metrics={},
        params=spec.params,
        tags=tags,
        metric_step=spec.last if spec.metric_step is None else spec.metric_step,
        window=_window_facts(spec),
        error=spec.error,
        summarised=False,
        staged=spec.staged,  # the traces are renamed into the window, not copied
        claimed=claimed,  # held by this process until its worker is done with the window
        **{"prefix": spec.prefix, **spec.manifest},
    )
    return record


def _window_facts(spec: WindowSpec) -> dict[str, Any]:
    return {"index": spec.index, "first": spec.first, "last": spec.last, "partial": spec.partial}


def write_summary(record: WindowRecord, spec: WindowSpec) -> WindowRecord:
    """Add the summary to a spooled window: metrics in the manifest, the summary files next
    to the traces; then the window gets ``spec.status`` (``pending``: ready to upload)."""
    document = {"prefix": spec.prefix, "window": _window_facts(spec), **spec.document}
    title = spec.title or f"{spec.prefix}: steps {spec.first}-{spec.last}"
    assert spec.summary is not None, "the window has not been summarised"
    summary = spec.summary.with_partial(spec.partial)
    write_summary_files(record.artifacts_dir, summary, title, document)
    # steps.jsonl (per-step samples for `compare`) and the _p50/_iqr metrics; never fails it
    from neuron_mlflow.trace.step_samples import write_step_samples

    steps = (record.artifacts_dir, record.artifacts_dir / "traces", spec.top_k)
    summary.extra.update(guarded(False, write_step_samples, *steps) or {})
    # report.html (the timeline from the window's trace): never fails the window
    report = (record.artifacts_dir, summary, record.manifest, spec.run_id)
    guarded(spec.strict, write_window_report, *report)
    metrics = {} if spec.traces_only else window_metrics_of(spec)
    metrics.update(spec.rank_metrics)
    record.summarised(metrics, incomplete=spec.status == "incomplete")
    return record


def assemble_window(spool: Spool, session_dir: Path, spec: WindowSpec) -> WindowRecord:
    """Write one whole window into the spool: :func:`spool_window`, then :func:`write_summary`.

    Args:
        spool: the spool.
        session_dir: the session's folder in the spool.
        spec: what the window is made of.

    Returns:
        The spooled window, claimed by this process until its ``release()`` (``sync`` leaves
        it alone until then).
    """
    record = spool_window(spool, session_dir, spec, claimed=True)
    try:
        return write_summary(record, spec)
    except BaseException:
        record.release()
        raise
