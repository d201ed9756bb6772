"""Read a finished live window from its own exported trace, with the trace engine.

The same code and counting rules as ``neuron-mlflow summarize``, ``ingest`` and ``compare``
(:func:`neuron_mlflow.trace.summarize.summarize_trace`), off the training thread.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from torch.profiler import ProfilerActivity, profile, record_function
    >>> folder, x = Path(tempfile.mkdtemp()), torch.ones(4)
    >>> with profile(activities=[ProfilerActivity.CPU]) as prof:
    ...     _ = torch.zeros(2)  # outside the marked call: left out
    ...     with record_function(CALL_MARKER_PREFIX + "double"):
    ...         _ = x.mul(x)
    >>> prof.export_chrome_trace(str(folder / "w.pt.trace.json"))
    >>> stats = read_window_trace(folder, device_label=None)
    >>> [op.name for op in stats.summary.ops], stats.summary.op_calls
    (['aten::mul'], 1.0)
    >>> [p.name for p in folder.iterdir()]  # compressed for the upload
    ['w.pt.trace.json.gz']
"""

from __future__ import annotations

import gzip
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_mlflow.naming import CALL_MARKER_PREFIX as CALL_MARKER_PREFIX
from neuron_mlflow.summary.ops import OpSummary, build_summary

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
NOT_TRACES = {"summary.json", "manifest.json", "op_keys.json"}
"""A window's own JSON files, never traces."""


@dataclass(slots=True)
class CapturedStats:
    """What one window's capture says, as window totals in microseconds.

    Attributes:
        summary: the window's summary, straight from its trace (``None``: no trace to read).
        device_busy_pct: the device's busy share of its span, from the trace.
        device_state: what the backend read of this window's device, for its analysis (the
            Neuron backend's notes: why numbers are absent).
    """

    summary: OpSummary | None = None
    device_busy_pct: float | None = None
    device_state: Any = None


def window_trace(trace_dir: Path) -> Path | None:
    """The trace file the backend wrote into ``trace_dir`` (the newest, if several).

    Example:
        >>> import tempfile
        >>> window_trace(Path(tempfile.mkdtemp())) is None
        True
    """
    if not trace_dir.is_dir():
        return None
    found = [p for p in trace_dir.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
    if not found:
        return None
    return max(found, key=lambda p: (p.name.endswith(TRACE_SUFFIXES[:2]), p.stat().st_mtime_ns))


def looks_like_trace(path: Path) -> bool:
    """A ``.json``/``.json.gz`` file (not one of :data:`NOT_TRACES`) whose start holds
    ``"traceEvents"``, or a bare JSON array of events: what ``ingest`` takes from a folder.

    Example:
        >>> import tempfile
        >>> plain = Path(tempfile.mkdtemp()) / "t.json"
        >>> _ = plain.write_text('{"traceEvents": []}')
        >>> looks_like_trace(plain), looks_like_trace(plain.with_name("summary.json"))
        (True, False)
    """
    if path.name in NOT_TRACES:
        return False
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
            head = handle.read(1 << 16)
    except OSError:
        return False
    return '"traceEvents"' in head or head.lstrip().startswith("[")


def compress_trace(path: Path) -> Path:
    """Replace ``path`` (a ``.json`` trace) by ``<path>.gz``; return the new path.

    Example:
        >>> import tempfile
        >>> plain = Path(tempfile.mkdtemp()) / "t.pt.trace.json"
        >>> _ = plain.write_text('{"traceEvents": []}')
        >>> compress_trace(plain).name, plain.exists()
        ('t.pt.trace.json.gz', False)
    """
    target = path.with_name(path.name + ".gz")
    partial = target.with_name(target.name + ".part")
    with path.open("rb") as source, gzip.open(partial, "wb", compresslevel=6) as sink:
        shutil.copyfileobj(source, sink, 1 << 20)
    os.replace(partial, target)
    path.unlink()
    return target


def read_window_trace(trace_dir: Path, device_label: str | None) -> CapturedStats:
    """Summarise the window whose trace is in ``trace_dir`` with the trace engine, then gzip
    an uncompressed trace in place (it is uploaded next).

    Args:
        trace_dir: the folder the backend exported the window's trace into.
        device_label: the backend's device label (``CUDA``...), ``None`` for CPU only.

    Returns:
        The stats with ``summary`` set; an empty summary if the folder holds no trace.

    Raises:
        TraceFormatError: the trace is truncated or malformed.
    """
    from neuron_mlflow.trace.summarize import summarize_trace

    path = window_trace(trace_dir)
    if path is None:
        return CapturedStats(summary=build_summary([], 0, 1, 0.0, device_label))
    result = summarize_trace(path, device_label)
    if path.suffix == ".json":
        compress_trace(path)
    busy = result.device_busy_pct if result.device_events else None
    return CapturedStats(summary=result.summary, device_busy_pct=busy)
