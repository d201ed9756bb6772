"""Write a spooled window's ``report.html`` (docs/report.md) from its artifact folder:
the lowest rank's trace, the summary and the window's manifest.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.summary.ops import RawOp, build_summary
    >>> folder = Path(tempfile.mkdtemp())
    >>> s = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
    >>> manifest = {"artifact_path": "profile/step_000000-000001",
    ...             "window": {"first": 0, "last": 1}, "tags": {"neuron_mlflow.backend": "cpu"}}
    >>> write_window_report(folder, s, manifest).name
    'report.html'
    >>> "steps 0-1" in (folder / "report.html").read_text()
    True
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from neuron_mlflow.errors import TraceFormatError
from neuron_mlflow.naming import REPORT_FILE, run_tag
from neuron_mlflow.summary.ops import OpSummary
from neuron_mlflow.summary.report import render_report
from neuron_mlflow.trace.step_samples import lowest_rank_trace, mark_disturbed
from neuron_mlflow.trace.timeline import build_timeline

logger = logging.getLogger("neuron_mlflow")

_TAGS = (
    ("backend", run_tag("backend")),
    ("device", run_tag("device")),
    ("host", run_tag("host")),
    ("rank", run_tag("rank")),
    ("world size", run_tag("world_size")),
    ("source", run_tag("source")),
)


def write_window_report(
    artifacts_dir: Path,
    summary: OpSummary,
    manifest: dict[str, Any],
    run_id: str | None = None,
    trace: Path | None = None,
) -> Path:
    """Write ``report.html`` into the window's artifact folder; return its path.

    Args:
        artifacts_dir: the window's artifact folder (with ``traces/``).
        manifest: the window's manifest (``tags``, ``window``, ``artifact_path``, ``run_id``):
            the page's header.
        run_id: the run the window goes to, when known before the upload (for the header).
        trace: the trace to draw (default: the lowest rank's under ``traces/``,
            :func:`~neuron_mlflow.trace.step_samples.lowest_rank_trace`).

    Step numbers on the page start at ``manifest["window"]["first"]``. A trace that cannot
    be read gives a report without a timeline (and an ``INFO`` log); other errors propagate.
    """
    tags = manifest.get("tags") or {}
    window = manifest.get("window") or {}
    header: dict[str, Any] = {k: tags.get(tag) for k, tag in _TAGS[:2]}
    if "first" in window:
        header["window"] = f"steps {window['first']}-{window.get('last', window['first'])}"
    header["window id"] = manifest.get("artifact_path")
    header["run"] = run_id or manifest.get("run_id") or manifest.get("run_name")
    header.update({k: tags.get(tag) for k, tag in _TAGS[2:]})
    header["neuron-mlflow"] = tags.get(run_tag("version"))
    header["torch"] = tags.get(run_tag("torch_version"))
    trace = trace or lowest_rank_trace(artifacts_dir / "traces")
    timeline = None
    first = window.get("first")
    if trace is not None:
        try:
            built = build_timeline(trace)
            if isinstance(first, int) and built.steps:
                # ProfilerStep#N counts from the profiler's creation, not the trainer's global
                # step: the page shows the window's numbers (``trace_step`` keeps N)
                base = min(step["trace_step"] for step in built.steps)
                for step in built.steps:
                    step["step"] = first + step["trace_step"] - base
            mark_disturbed(built.steps, trace)  # steps other processes slowed down
            timeline = built.to_dict()
        except (TraceFormatError, OSError, EOFError) as exc:
            logger.info("report.html without a timeline: %s", exc)
    target = artifacts_dir / REPORT_FILE
    page = render_report(summary, header, timeline)  # it leaves out the empty values
    target.write_text(page, encoding="utf-8")
    return target
