"""The Neuron backend: TorchNeuron's profiler on AWS Trainium, as AWS documents it.

``torch_neuronx.profiling`` is imported lazily. What a window passes to ``NeuronConfig``, the
framework trace's names and where its device time comes from: docs/neuron.md ("The capture,
as AWS documents it"; "Device time: the same rules as every backend").

Example:
    >>> NeuronBackend.name, NeuronBackend.device_label
    ('neuron', 'NEURON')
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import warnings
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from neuron_mlflow.capture.backends.base import BaseBackend
from neuron_mlflow.capture.backends.neuron_analysis import DeviceAnalysis, analyze_window
from neuron_mlflow.capture.backends.neuron_device_time import (
    DeviceTimes,
    read_device_times,
    with_device_times,
)
from neuron_mlflow.capture.profile_reader import CapturedStats
from neuron_mlflow.summary.ops import OpSummary

if TYPE_CHECKING:
    import torch.profiler

    from neuron_mlflow.config import ProfilerConfig

log = logging.getLogger("neuron_mlflow")

INSTALL_HINT = (
    "install TorchNeuron from the AWS Neuron package index, e.g. `pip install torch-neuronx "
    "--extra-index-url https://pip.repos.neuron.amazonaws.com` (on a Trainium host with the "
    "Neuron driver and runtime)"
)
PROFILE_ENVIRONMENT = (
    "XLA_IR_DEBUG",
    "XLA_HLO_DEBUG",
    "NEURON_FRAMEWORK_DEBUG",
    "NEURON_RT_NUM_CORES",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_VIRTUAL_CORE_SIZE",
)
DEFAULTED_OPTIONS = ("correlate_device_time", "precache_node_info")
"""Documented options passed even when the user did not set them (their defaults)."""
_told_unsupported: set[str] = set()
KEY_AVERAGES_FILE = "device_times.key_averages.json"
"""Device times read from ``key_averages()`` at the window's end, when its trace has none."""

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


_DEVICE_EVENT_MARKS = (b'"cat": "kernel"', b'"cat":"kernel"')


def _has_device_events(trace: Path) -> bool:
    """Whether the framework trace holds a device (``kernel``) event: a byte scan."""
    import mmap

    try:
        with open(trace, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return any(m.find(mark) >= 0 for mark in _DEVICE_EVENT_MARKS)
    except (OSError, ValueError):
        return True


class NeuronBackend(BaseBackend):
    """Profile CPU operators and NeuronCore activity with TorchNeuron's profiler.

    Example:
        >>> reason = NeuronBackend.unavailable_reason()
        >>> reason is None or "torch_neuronx" in reason
        True
    """

    name: ClassVar[str] = "neuron"
    device_label: ClassVar[str | None] = "NEURON"
    device_activity: ClassVar[str | None] = "PrivateUse1"

    def __init__(self, config: ProfilerConfig | None = None) -> None:
        super().__init__(config)
        self._exporter: Any = None
        self.unsupported_options: set[str] = set()
        if os.environ.get("NEURON_RT_INSPECT_ENABLE") == "1":
            warnings.warn(
                "NEURON_RT_INSPECT_ENABLE=1 is set: the runtime's own capture conflicts with "
                "torch.profiler capture; unset it while profiling with neuron-mlflow",
                UserWarning,
                stacklevel=3,
            )
        if config is not None and "device" in config.neuron.modes:
            log.info(
                "neuron-mlflow: Neuron 'device' mode captures NeuronCore instruction traces and "
                "reserves device memory (about 5 GB of HBM on Trn2) while a window runs"
            )

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import torch_neuronx
            import torch_neuronx.profiling  # noqa: F401
        except ImportError as exc:
            if "WRONG PACKAGE" in str(exc):
                return (
                    "backend='neuron': the installed torch_neuronx is PyPI's placeholder "
                    f"package ({str(exc)[:80]}...), not the Neuron SDK; uninstall it and "
                    + INSTALL_HINT
                )
            return f"backend='neuron' needs the AWS Neuron SDK (torch_neuronx: {exc}); " + (
                INSTALL_HINT
            )
        import torch

        neuron = getattr(torch, "neuron", None)
        count = getattr(neuron, "device_count", None)
        if neuron is None or (count is not None and count() == 0):
            return (
                "backend='neuron': torch_neuronx imports but no Neuron device is visible "
                "(check the Neuron driver and NEURON_RT_VISIBLE_CORES), or use backend='cpu'"
            )
        return None

    def _tell_unsupported(self, name: str, exc: TypeError) -> None:
        self.unsupported_options.add(name)
        if name in _told_unsupported:
            return
        _told_unsupported.add(name)
        effect = (
            "device time reaches key_averages() only if this SDK puts it there by itself"
            if name == "correlate_device_time"
            else "the SDK uses its own default"
        )
        warnings.warn(
            f"neuron-mlflow: this Neuron SDK's NeuronConfig does not accept {name!r} "
            f"({exc}); profiling goes on without it ({effect}). Set "
            f"neuron.{name} explicitly to make this an error, or upgrade the Neuron SDK",
            UserWarning,
            stacklevel=2,
        )

    def profiler_kwargs(self, config: ProfilerConfig, output_dir: Path) -> dict[str, Any]:
        """``NeuronConfig`` (docs/neuron.md): an SDK that rejects one of
        :data:`DEFAULTED_OPTIONS` left at its default is told once and goes on without it."""
        from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

        options = config.neuron
        kwargs: dict[str, Any] = {
            "modes": [getattr(ProfileMode, mode.upper()) for mode in options.modes],
            "profile_output_dir": str(output_dir),
            "correlate_device_time": options.correlate_device_time,
            "precache_node_info": options.precache_node_info,
        }
        for name in ("capture_enabled_for_nc", "max_events_per_nc", "neff_cache_dir"):
            value = getattr(options, name)
            if value is not None:
                kwargs[name] = str(value) if name == "neff_cache_dir" else value
        kwargs = {k: v for k, v in kwargs.items() if k not in self.unsupported_options}
        while True:
            try:
                neuron_config = NeuronConfig(**kwargs)
                break
            except TypeError as exc:
                dropped = [
                    name
                    for name in DEFAULTED_OPTIONS
                    if name in kwargs and name in str(exc) and name not in options.model_fields_set
                ]
                if not dropped:
                    raise
                for name in dropped:
                    kwargs.pop(name)
                    self._tell_unsupported(name, exc)
        self._exporter = NeuronProfiler(neuron_config)
        return {"experimental_config": neuron_config}

    def export_trace(self, prof: torch.profiler.profile, output_dir: Path) -> None:
        """``NeuronProfiler(cfg).export_trace``: the Neuron tree, names and nesting as written.

        The worker cannot reach this profiler: when the framework trace holds no device event
        (a byte scan decides), the device times are read from the profiler's events here and
        kept next to the trace (:data:`KEY_AVERAGES_FILE`).
        """
        self._exporter.export_trace(prof)
        traces = framework_traces(output_dir)
        if traces and not _has_device_events(traces[0]):
            times = read_device_times(prof.events())
            if times.device_us > 0:
                (output_dir / KEY_AVERAGES_FILE).write_text(
                    json.dumps(asdict(times)), encoding="utf-8"
                )

    def synchronize(self) -> None:
        import torch

        torch.neuron.synchronize()  # type: ignore[attr-defined]

    def refine_device_time(self, trace_dir: Path) -> tuple[CapturedStats, str]:
        """Summarise the window whose output is in ``trace_dir`` (off the training thread):
        device time from the trace's device events, else from what :meth:`export_trace` kept.
        """
        from neuron_mlflow.trace.summarize import summarize_trace

        notes: list[str] = []  # why numbers are absent: the window's, not the backend's
        stats = CapturedStats(device_state=notes)
        traces = framework_traces(trace_dir)
        if not traces:
            names = " or ".join(FRAMEWORK_TRACE_NAMES)
            notes.append(f"no framework trace ({names}) in the window")
            return stats, "none"
        result = summarize_trace(traces[0], self.device_label)
        stats.summary = result.summary
        if result.device_events > 0 and result.summary.device_time_us is not None:
            stats.device_busy_pct = result.device_busy_pct
            return stats, "trace"
        kept = trace_dir / KEY_AVERAGES_FILE
        times = DeviceTimes(**json.loads(kept.read_text("utf-8"))) if kept.is_file() else None
        if times is not None and times.device_us > 0:
            stats.summary = with_device_times(result.summary, times)
            stats.device_busy_pct = times.busy_pct
            return stats, "key_averages"
        note = (
            "NEURON device time was not captured in this window (neither the framework trace "
            "nor key_averages() held any)"
        )
        if "correlate_device_time" in self.unsupported_options:
            note += "; this SDK does not accept correlate_device_time"
        notes.append(note)
        return stats, "none"

    def analyze_window(
        self,
        prefix: str,
        summary: OpSummary,
        trace_dir: Path,
        out_dir: Path,
        stats: CapturedStats,
    ) -> DeviceAnalysis:
        """:func:`~neuron_mlflow.capture.backends.neuron_analysis.analyze_window`, with the
        busy share read with the device time and the window's notes."""
        mode = self.config.neuron.explorer_summary if self.config is not None else "auto"
        busy = stats.device_busy_pct
        notes = stats.device_state
        return analyze_window(prefix, summary, busy, trace_dir, out_dir, mode, notes=notes)

    def describe(self) -> dict[str, str]:
        facts = super().describe()
        for package, key in (
            ("torch-neuronx", "torch_neuronx_version"),
            ("neuronx-cc", "neuronx_cc_version"),
        ):
            with contextlib.suppress(metadata.PackageNotFoundError):
                facts[key] = metadata.version(package)
        if "torch_neuronx_version" not in facts:
            import torch_neuronx

            facts["torch_neuronx_version"] = str(getattr(torch_neuronx, "__version__", "unknown"))
        for name in PROFILE_ENVIRONMENT:
            if name in os.environ:
                facts[f"env.{name}"] = os.environ[name]
        if self.config is not None:
            facts["neuron.modes"] = ",".join(self.config.neuron.modes)
            facts["neuron.cores"] = self.config.neuron.capture_enabled_for_nc or "all"
            for name in DEFAULTED_OPTIONS:
                value = getattr(self.config.neuron, name)
                facts[f"neuron.{name}"] = (
                    "unsupported" if name in self.unsupported_options else str(value).lower()
                )
        return facts

    def restore(self, facts: dict[str, str]) -> None:
        """The options the training host's SDK refused (its summary notes them)."""
        for name in DEFAULTED_OPTIONS:
            if facts.get(f"neuron.{name}") == "unsupported":
                self.unsupported_options.add(name)
