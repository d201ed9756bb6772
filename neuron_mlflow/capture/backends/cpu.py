"""The CPU backend: operator times on the host, no device time.

Example:
    >>> CpuBackend().describe()["backend"]
    'cpu'
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from neuron_mlflow.capture.backends.base import Backend

if TYPE_CHECKING:
    import torch.profiler


class CpuBackend(Backend):
    """Profile CPU operators only (``ProfilerActivity.CPU``); always available.

    Example:
        >>> CpuBackend.unavailable_reason() is None
        True
    """

    name = "cpu"
    device_label = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def activities(self) -> list[torch.profiler.ProfilerActivity]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "device": platform.processor() or platform.machine()}
