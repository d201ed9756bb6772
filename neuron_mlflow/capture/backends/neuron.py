"""The Neuron backend: TorchNeuron's profiler on AWS Trainium, as AWS documents it.

``torch_neuronx.profiling`` is imported lazily. A window runs ``torch.profiler.profile`` with
``activities=[CPU, PrivateUse1]``, ``experimental_config=NeuronConfig(...)`` (the modes mapped
to ``ProfileMode`` members by name, ``profile_output_dir`` inside the window's spool folder,
and only the options the user set) and ``on_trace_ready=NeuronProfiler(cfg).export_trace``;
``torch.neuron.synchronize()`` runs before each step ends. The whole output tree
(``<instance-id>_pid_<pid>/<timestamp>/`` with ``trace.json``, ``*.pb``, ``*.neff``,
``*.ntff``) is uploaded unchanged under ``traces/rank_<r>/``.

Device time comes from ``key_averages()``; when every device time there is zero, from the
``privateuse1_driver`` events of the window's ``trace.json`` linked to operators through
their ``privateuse1_runtime`` calls (``args.correlation``), read by the trace engine
(:func:`neuron_mlflow.trace.summarize.summarize_trace`).

Example:
    >>> NeuronBackend.name, NeuronBackend.device_label
    ('neuron', 'NEURON')
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import defaultdict
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.capture.backends.base import Backend
from neuron_mlflow.summary.ops import RawOp

if TYPE_CHECKING:
    import torch.profiler

    from neuron_mlflow.capture.profile_reader import CapturedStats
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


class NeuronBackend(Backend):
    """Profile CPU operators and NeuronCore activity with TorchNeuron's profiler.

    Example:
        >>> reason = NeuronBackend.unavailable_reason()
        >>> reason is None or "torch_neuronx" in reason
        True
    """

    name = "neuron"
    device_label = "NEURON"

    def __init__(self, config: ProfilerConfig | None = None) -> None:
        super().__init__(config)
        self._exporter: Any = None
        if os.environ.get("NEURON_RT_INSPECT_ENABLE") == "1":
            import warnings

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

    def activities(self) -> list[torch.profiler.ProfilerActivity]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]

    def neuron_config(self, config: ProfilerConfig, output_dir: Path) -> Any:
        """Build ``NeuronConfig``: modes by ``ProfileMode`` member name, the output folder,
        and only the options the user set."""
        from torch_neuronx.profiling import NeuronConfig, ProfileMode

        options = config.neuron
        kwargs: dict[str, Any] = {
            "modes": [getattr(ProfileMode, mode.upper()) for mode in options.modes],
            "profile_output_dir": str(output_dir),
        }
        for field in ("capture_enabled_for_nc", "max_events_per_nc", "neff_cache_dir"):
            value = getattr(options, field)
            if value is not None:
                kwargs[field] = str(value) if field == "neff_cache_dir" else value
        if "correlate_device_time" in options.model_fields_set:
            kwargs["correlate_device_time"] = options.correlate_device_time
        return NeuronConfig(**kwargs)

    def profiler_kwargs(self, config: ProfilerConfig, output_dir: Path) -> dict[str, Any]:
        from torch_neuronx.profiling import NeuronProfiler

        neuron_config = self.neuron_config(config, output_dir)
        self._exporter = NeuronProfiler(neuron_config)
        return {"experimental_config": neuron_config}

    def export_trace(self, prof: torch.profiler.profile, output_dir: Path) -> None:
        """``NeuronProfiler(cfg).export_trace``: the Neuron tree, names and nesting as written."""
        self._exporter.export_trace(prof)

    def synchronize(self) -> None:
        import torch

        torch.neuron.synchronize()

    def refine_device_time(
        self, stats: CapturedStats, trace_dir: Path
    ) -> tuple[CapturedStats, str]:
        """Use ``key_averages()`` device time, else the device events of ``trace.json``."""
        stats, source = super().refine_device_time(stats, trace_dir)
        if source == "key_averages":
            return stats, source
        from neuron_mlflow.trace.summarize import summarize_trace

        per_op: dict[str, float] = defaultdict(float)
        per_kernel: dict[str, float] = defaultdict(float)
        for trace in sorted(trace_dir.rglob("trace.json")):
            result = summarize_trace(trace, self.device_label)
            for op in result.summary.ops:  # back from per step to window totals
                per_op[op.name] += (op.self_device_us or 0.0) * result.summary.steps
            for name, us in result.kernels.items():
                per_kernel[name] += us
        if not per_kernel:
            return stats, "none"
        stats.cpu_ops = [
            replace(
                op,
                self_device_us=per_op.get(op.name, 0.0),
                device_total_us=per_op.get(op.name, 0.0),
            )
            for op in stats.cpu_ops
        ]
        # With marked calls only the calls' own operators count, so the device total is theirs.
        stats.device_rows = (
            []
            if stats.calls_marked
            else [RawOp(name, 1, 0.0, 0.0, us, us) for name, us in per_kernel.items()]
        )
        return stats, "trace"

    def describe(self) -> dict[str, str]:
        facts = {"backend": self.name, "device": self.device_label or "NEURON"}
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
        return facts
