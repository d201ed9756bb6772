"""The contract every profiling backend implements: :class:`BaseBackend`.

The engine types a backend as :class:`BaseBackend`, which declares its calls and holds the
defaults the cpu, cuda and neuron backends share. A backend keeps no state of a window
between its calls: what one window needs travels with that window.

Example:
    >>> from neuron_mlflow.capture.backends.cpu import CpuBackend
    >>> backend: BaseBackend = CpuBackend()
    >>> backend.name, backend.device_label
    ('cpu', None)
"""

from __future__ import annotations

import abc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from neuron_mlflow.capture.profile_reader import CapturedStats, read_window_trace

if TYPE_CHECKING:
    import torch.profiler

    from neuron_mlflow.capture.backends.neuron_analysis import DeviceAnalysis
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.summary.ops import OpSummary


class BaseBackend(abc.ABC):
    """What the engine calls on a backend, and the defaults the backends share.

    Attributes:
        name: the ``ProfilerConfig.backend`` value that selects it.
        device_label: column label of device time (``CUDA``, ``NEURON``), ``None`` if CPU-only.
        device_activity: the device's ``ProfilerActivity`` member name, ``None`` if CPU-only.
    """

    name: ClassVar[str]
    device_label: ClassVar[str | None] = None
    device_activity: ClassVar[str | None] = None

    def __init__(self, config: ProfilerConfig | None = None) -> None:
        self.config = config

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls) -> str | None:
        """``None`` when the backend can run here, else what is missing and how to get it."""

    def activities(self) -> list[torch.profiler.ProfilerActivity]:
        """``torch.profiler`` activities to record: the CPU's, and ``device_activity``'s."""
        from torch.profiler import ProfilerActivity

        device = [getattr(ProfilerActivity, self.device_activity)] if self.device_activity else []
        return [ProfilerActivity.CPU, *device]

    def profiler_kwargs(self, config: ProfilerConfig, output_dir: Path) -> dict[str, Any]:
        """Extra keyword arguments for ``torch.profiler.profile`` (e.g. ``experimental_config``).

        Args:
            output_dir: the window's trace folder, where the backend writes its output.
        """
        return {}

    def export_trace(self, prof: torch.profiler.profile, output_dir: Path) -> None:
        """Write the window's trace into ``output_dir`` (the ``on_trace_ready`` work).

        The default is torch's Chrome-trace export, named like ``tensorboard_trace_handler``
        names it, uncompressed: this runs on the training thread, and torch's gzip export is
        several times slower; the worker compresses it.
        """
        import socket

        output_dir.mkdir(parents=True, exist_ok=True)
        name = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}.pt.trace.json"
        prof.export_chrome_trace(str(output_dir / name))

    def synchronize(self) -> None:  # noqa: B027 - optional hook, CPU needs nothing
        """Wait for queued device work, so that a step's device time falls inside it."""

    def refine_device_time(self, trace_dir: Path) -> tuple[CapturedStats, str | None]:
        """The window read from its own trace (``stats.summary``, off the training thread),
        and where its device time comes from: ``trace`` or ``none`` (``None`` for a backend
        without device time)."""
        stats = read_window_trace(trace_dir, self.device_label)
        if self.device_label is None:
            return stats, None
        measured = stats.summary is not None and stats.summary.device_time_us is not None
        return stats, "trace" if measured else "none"

    def analyze_window(
        self,
        prefix: str,
        summary: OpSummary,
        trace_dir: Path,
        out_dir: Path,
        stats: CapturedStats,
    ) -> DeviceAnalysis | None:
        """Off the training thread: the device analysis of a summarised window (metrics,
        tags, files into ``out_dir``), or ``None`` (the default) when the backend has none."""
        return None

    def describe(self) -> dict[str, str]:
        """Facts for run tags: at least ``backend`` and ``device``."""
        return {"backend": self.name, "device": self.device_label or "CPU"}

    def restore(self, facts: dict[str, str]) -> None:  # noqa: B027 - nothing to restore
        """In the worker process: take back what :meth:`describe` said on the training host
        (``facts``, without the tag prefix), for the window's summary; nothing by default."""
