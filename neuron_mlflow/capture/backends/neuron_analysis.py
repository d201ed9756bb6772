"""Device-level analysis of one Neuron window: Explorer numbers, MFU and the verdict.

Runs after the window, off the training thread (docs/neuron.md, "Device level: Neuron
Explorer, MFU and the verdict"). Without ``neuron-explorer`` nothing fails: the summary says
why those numbers are absent.

Example:
    >>> from neuron_mlflow.summary.ops import RawOp, build_summary
    >>> s = build_summary([RawOp("aten::mul", 3, 60.0, 60.0, 900.0, 900.0)], 3, 1, 2e3,
    ...                   device_label="NEURON")
    >>> a = analyze_window("P", s, 40.0, None, None, mode="never")
    >>> a.summary.extra["verdict"]["window"], a.metrics
    ('overhead-bound', {})
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from neuron_mlflow.capture.backends import neuron_explorer, neuron_peaks
from neuron_mlflow.naming import metric_key
from neuron_mlflow.summary.ops import OpSummary
from neuron_mlflow.summary.verdict import VERDICT_KEY, VerdictInputs, verdict_document


@dataclass
class DeviceAnalysis:
    """What the analysis adds to a window.

    Attributes:
        summary: the window's summary with the verdict and notes in ``extra``.
        metrics: ``P/neuron/...``, ``P/mfu_pct``, ``P/achieved_tflops`` (already named).
        tags: run tags (the window's verdict).
        notes: why numbers are absent (also in the summary).
        errors: what failed (Explorer's exit, a malformed file).
    """

    summary: OpSummary
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def profile_dir(trace_dir: Path) -> Path:
    """The folder given to ``-d``: the one ``<instance>_pid_<pid>/<timestamp>/`` profile
    folder of the window, else ``trace_dir`` (Explorer takes a parent of several)."""
    folders = {p.parent for p in trace_dir.rglob("trace_info.pb")} or {
        p.parent for p in trace_dir.rglob("*.ntff")
    }
    return folders.pop() if len(folders) == 1 else trace_dir


def cores_used() -> int:
    """NeuronCores this process runs on: ``NEURON_RT_NUM_CORES``, else 1."""
    value = os.environ.get("NEURON_RT_NUM_CORES", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _instance_type(explorer: dict[str, Any], hint: str | None) -> str | None:
    for profile in explorer.values() if explorer else ():
        if isinstance(profile, dict) and isinstance(profile.get("instance_type"), str):
            return str(profile["instance_type"])
    return hint or neuron_peaks.host_instance_type()


def _explorer(
    analysis: DeviceAnalysis, prefix: str, trace_dir: Path | None, out_dir: Path | None, mode: str
) -> dict[str, Any]:
    if mode == "never":
        analysis.notes.append("Neuron Explorer summary: off (neuron.explorer_summary='never')")
        return {}
    exe = shutil.which(neuron_explorer.EXPLORER)
    if exe is None:
        note = (
            "Device-level numbers (P/neuron/..., engine shares, MBU) are absent: "
            "neuron-explorer is not on PATH on this host (install aws-neuronx-tools)"
        )
        analysis.notes.append(note)
        if mode == "always":
            analysis.errors.append(note)
        return {}
    if trace_dir is None or out_dir is None:
        return {}
    target = out_dir / neuron_explorer.SUMMARY_FILE
    try:
        data = neuron_explorer.run_summary(profile_dir(trace_dir), target, exe)
    except Exception as exc:
        analysis.errors.append(f"neuron-explorer summary failed: {type(exc).__name__}: {exc}")
        analysis.notes.append("Device-level numbers are absent: neuron-explorer failed")
        target.unlink(missing_ok=True)
        return {}
    analysis.metrics.update(neuron_explorer.explorer_metrics(prefix, data))
    return data


def analyze_window(
    prefix: str,
    summary: OpSummary,
    device_busy_pct: float | None,
    trace_dir: Path | None,
    out_dir: Path | None,
    mode: str = "auto",
    instance_type: str | None = None,
    notes: list[str] | None = None,
) -> DeviceAnalysis:
    """Analyse one window (see the module docstring).

    Args:
        prefix: the metric prefix ``P``.
        trace_dir: the window's Neuron output (the profile tree).
        out_dir: where ``neuron_summary.json`` goes (the window's artifact folder).
        mode: ``neuron.explorer_summary``: ``auto``, ``always`` or ``never``.
        instance_type: a hint for when the Explorer summary names none (default: this
            host's, :func:`~neuron_mlflow.capture.backends.neuron_peaks.host_instance_type`).
        notes: the window's notes so far (why numbers are absent), put first.
    """
    analysis = DeviceAnalysis(summary, notes=list(notes or []))
    data = _explorer(analysis, prefix, trace_dir, out_dir, mode)
    head = neuron_explorer.headline(data) if data else {}
    peak = neuron_peaks.chip_peak(_instance_type(data, instance_type))
    peak_tflops = (
        peak.core_tflops(neuron_peaks.logical_core_config()) * cores_used() if peak else None
    )
    achieved = None
    if summary.flops_per_step is not None and summary.wall_time_us > 0:
        achieved = summary.flops_per_step / summary.wall_time_us / 1e6
    elif head.get("hardware_flops") and head.get("total_time_us"):
        achieved = head["hardware_flops"] / head["total_time_us"] / 1e6
        analysis.metrics[metric_key(prefix, "achieved_tflops")] = achieved
    mfu = head.get("mfu_pct")
    if mfu is None and achieved is not None and peak_tflops:
        mfu = 100.0 * achieved / peak_tflops
    if mfu is not None:
        analysis.metrics[metric_key(prefix, "mfu_pct")] = mfu
    elif achieved is not None:
        analysis.notes.append("P/mfu_pct is absent: the instance type (peak TFLOPS) is unknown")
    engines = [head.get(f"{e}_engine_active_pct") for e in neuron_explorer.ENGINES if e != "sync"]
    compute = [v for v in (mfu, *engines) if v is not None]
    memory = [v for v in (head.get("mbu_pct"), head.get("dma_active_pct")) if v is not None]
    inputs = VerdictInputs(
        device_busy_pct=device_busy_pct,
        compute_pct=max(compute) if compute else None,
        memory_pct=max(memory) if memory else None,
    )
    flops = {op.name: op.flops for op in summary.ops if op.flops}
    document = verdict_document(summary, inputs, flops_by_op=flops)
    if document["window"]:
        analysis.tags[f"neuron_mlflow.verdict/{prefix}"] = document["window"]
    extra = {**summary.extra, VERDICT_KEY: document, "device_notes": list(analysis.notes)}
    analysis.summary = replace(summary, extra=extra)
    return analysis
