"""Neuron Explorer's device-level summary of a window, as MLflow metrics.

The command it runs after a window and the metrics it logs: docs/neuron.md ("Device level:
Neuron Explorer, MFU and the verdict").

Example:
    >>> doc = {"n_1f": {"total_time": 0.002, "tensor_engine_active_time_percent": 0.4}}
    >>> sorted(headline(doc).items())
    [('tensor_engine_active_pct', 40.0), ('total_time_us', 2000.0)]
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neuron_mlflow.naming import neuron_metric_key

EXPLORER = "neuron-explorer"
SUMMARY_FILE = "neuron_summary.json"
"""The file uploaded into the window's artifact folder."""
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")
_SECONDS = {"total_time": "total_time_us", "total_active_time": "active_time_us"}
_PERCENT = {
    **{f"{e}_engine_active_time_percent": f"{e}_engine_active_pct" for e in ENGINES},
    "dma_active_time_percent": "dma_active_pct",
    "mfu_estimated_percent": "mfu_pct",
    "mbu_estimated_percent": "mbu_pct",
}
_SUMMED = {"hardware_flops": "hardware_flops", "model_flops": "model_flops"}


def run_summary(profile_dir: Path, output_file: Path, executable: str) -> dict[str, Any]:
    """Run the export with ``executable`` and return the summary (also written to
    ``output_file``).

    Explorer prints ``summary-json`` on stdout; when it writes no ``output_file``, stdout is
    saved there.

    Raises:
        RuntimeError: it failed, or its output is not JSON (the message has its stderr).
    """
    output_file.parent.mkdir(parents=True, exist_ok=True)
    command = [executable, "view", "-d", str(profile_dir), "--output-format", "summary-json"]
    done = subprocess.run(
        [*command, "--output-file", str(output_file)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{EXPLORER} exited with {done.returncode} on {profile_dir}: {done.stderr[-1000:]}"
        )
    if not output_file.is_file() or output_file.stat().st_size == 0:
        output_file.write_text(done.stdout)
    try:
        data = json.loads(output_file.read_text())
    except ValueError as exc:
        raise RuntimeError(f"{EXPLORER} summary-json is not JSON ({exc}): {output_file}") from exc
    if not isinstance(data, dict):
        raise RuntimeError(f"{EXPLORER} summary-json is not a JSON object: {output_file}")
    return data


def _number(value: Any) -> float | None:
    """A finite JSON number (not a bool) as a float, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, (*path, str(key)))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _leaves(inner, (*path, str(i)))
    elif (number := _number(value)) is not None:
        yield path, number


def numeric_leaves(data: dict[str, Any]) -> dict[tuple[str, ...], float]:
    """Every finite number in the summary by its key path (one top-level id dropped).

    Example:
        >>> numeric_leaves({"n_1": {"a": 1, "b": {"c": 2.5}, "ok": True, "s": "x"}})
        {('a',): 1.0, ('b', 'c'): 2.5}
    """
    root: Any = data
    if len(data) == 1 and isinstance(next(iter(data.values())), dict):
        root = next(iter(data.values()))
    return dict(_leaves(root))


def _profiles(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat dicts of Summary fields: one per device profile (or the document itself)."""
    if not data or not all(isinstance(v, dict) for v in data.values()):
        return [data]
    return [p for v in data.values() for p in ([v] if _has_fields(v) else _profiles(v))]


def _has_fields(value: dict[str, Any]) -> bool:
    return any(k in value for k in (*_SECONDS, *_PERCENT, *_SUMMED))


def headline(data: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of :data:`_SECONDS`, :data:`_PERCENT` and :data:`_SUMMED`.

    Times, FLOPs and bytes are summed over device profiles; percentages are averaged,
    weighted by each profile's ``total_time`` (equal weights without it), and read as a 0-1
    scale when every ``*_percent`` value in the file is at most 1.
    """
    percents = [v for path, v in numeric_leaves(data).items() if path[-1].endswith("_percent")]
    scale = 100.0 if percents and all(0.0 <= v <= 1.0 for v in percents) else 1.0
    profiles = [p for p in _profiles(data) if _has_fields(p)]
    out: dict[str, float] = {}
    for fields, factor in ((_SECONDS, 1e6), (_SUMMED, 1.0)):  # seconds -> us
        for field, name in fields.items():
            values = [v for p in profiles if (v := _number(p.get(field))) is not None]
            if values:
                out[name] = sum(values) * factor
    traffic = [
        (_number(p.get("hbm_read_bytes")), _number(p.get("hbm_write_bytes"))) for p in profiles
    ]
    hbm = [
        (read or 0.0) + (write or 0.0) for read, write in traffic if (read, write) != (None, None)
    ]
    if hbm:
        out["hbm_bytes"] = sum(hbm)
    for field, name in _PERCENT.items():
        pairs = [
            (v, _number(p.get("total_time")) or 1.0)
            for p in profiles
            if (v := _number(p.get(field))) is not None
        ]
        if pairs:
            weight = sum(w for _, w in pairs)
            out[name] = scale * sum(v * w for v, w in pairs) / weight
    return out


def explorer_metrics(prefix: str, data: dict[str, Any]) -> dict[str, float]:
    """``P/neuron/<headline>`` and ``P/neuron/summary/<path>`` for every numeric leaf.

    Example:
        >>> sorted(explorer_metrics("P", {"n_1": {"total_time": 0.5}}))
        ['P/neuron/summary/total_time', 'P/neuron/total_time_us']
    """
    metrics = {neuron_metric_key(prefix, name): v for name, v in headline(data).items()}
    for path, value in numeric_leaves(data).items():
        metrics[neuron_metric_key(prefix, "summary", *path)] = value
    return metrics
