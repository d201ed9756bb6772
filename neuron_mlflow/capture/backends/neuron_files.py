"""The Neuron window's files and what the backend reads from them.

The framework trace has two documented names: ``trace.json`` (written by
``NeuronProfiler(cfg).export_trace`` next to the Neuron system trace) and
``neuron_framework_trace_rank_<N>.json`` (the troubleshooting guide); either is read.

Example:
    >>> NeuronWindow(None).source
    'none'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from neuron_mlflow.summary.ops import OpSummary

FRAMEWORK_TRACE_NAMES = ("trace.json", "neuron_framework_trace_rank_*.json")
"""The framework trace's documented names (``export_trace``; the troubleshooting guide)."""
_RANK_TRACE = re.compile(r"^neuron_framework_trace_rank_(\d+)\.json$")


def framework_traces(root: Path) -> list[Path]:
    """The framework traces under ``root``: in each folder ``trace.json``, else the
    ``neuron_framework_trace_rank_<N>.json`` files (both names are documented).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> _ = (root / "neuron_framework_trace_rank_1.json").write_text("{}")
        >>> [p.name for p in framework_traces(root)]
        ['neuron_framework_trace_rank_1.json']
    """
    by_folder: dict[Path, list[Path]] = {}
    for pattern in FRAMEWORK_TRACE_NAMES:
        for path in sorted(root.rglob(pattern)):
            if path.is_file():
                by_folder.setdefault(path.parent, []).append(path)
    found: list[Path] = []
    for folder in sorted(by_folder):
        files = by_folder[folder]
        plain = [p for p in files if p.name == "trace.json"]
        found.extend(plain or [p for p in files if _RANK_TRACE.match(p.name)])
    return found


@dataclass
class NeuronWindow:
    """One window's summary as the Neuron backend reads it.

    Attributes:
        summary: the trace engine's summary of the framework trace, with device time from
            the trace or from the profiler's events; ``None`` without a framework trace.
        source: where device time came from: ``trace``, ``key_averages`` or ``none``.
        device_busy_pct: the device's busy share of its span, when known.
        notes: why numbers are absent, for the summary.
    """

    summary: OpSummary | None
    source: str = "none"
    device_busy_pct: float | None = None
    notes: list[str] = field(default_factory=list)
