"""The CPU backend: operator times on the host, no device time.

Example:
    >>> CpuBackend().describe()["backend"]
    'cpu'
"""

from __future__ import annotations

import platform
from typing import ClassVar

from neuron_mlflow.capture.backends.base import BaseBackend


class CpuBackend(BaseBackend):
    """Profile CPU operators only (``ProfilerActivity.CPU``); always available.

    Example:
        >>> CpuBackend.unavailable_reason() is None
        True
    """

    name: ClassVar[str] = "cpu"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "device": platform.processor() or platform.machine()}
