"""What both trace passes produce: per-operator window totals and trace-wide facts.

Also the event categories each backend writes, shared by the passes.

Example:
    >>> totals = Totals()
    >>> totals.name_id("aten::mul"), totals.names, totals.count
    (0, ['aten::mul'], [0.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEVICE_CATEGORIES = {
    "kernel": "CUDA",
    "gpu_memcpy": "CUDA",
    "gpu_memset": "CUDA",
    "cuda_profiler_range": "CUDA",
    "mtia_ccp_events": "MTIA",
    "privateuse1_driver": "NEURON",
}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "mtia_runtime", "privateuse1_runtime"}
OP_CATEGORIES = {"cpu_op", "user_annotation"}
STEP_MARKER = "ProfilerStep"


@dataclass
class Totals:
    """Window totals per operator/kernel name id (in microseconds), and trace-wide facts.

    Example:
        >>> totals = Totals()
        >>> totals.name_id("aten::mul"), totals.name_id("aten::add"), totals.name_id("aten::mul")
        (0, 1, 0)
        >>> totals.device_event("kernel", "mul_kernel", 4.0)
        >>> totals.kernel_us, totals.labels, totals.device_events
        ({2: 4.0}, {'CUDA'}, 1)
    """

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    count: list[float] = field(default_factory=list)
    self_cpu: list[float] = field(default_factory=list)
    total_cpu: list[float] = field(default_factory=list)
    self_device: list[float] = field(default_factory=list)
    kernel_us: dict[int, float] = field(default_factory=dict)
    top_level: int = 0
    steps: int = 0
    step_us: float = 0.0
    span_start: float = math.inf
    span_end: float = -math.inf
    device_events: int = 0
    attributed: int = 0
    busy_pct: float | None = None
    labels: set[str] = field(default_factory=set)

    def add_name(self, name: str) -> int:
        """Give ``name`` the next id, with zeroed totals (the caller checked ``ids``)."""
        index = self.ids[name] = len(self.names)
        self.names.append(name)
        for column in (self.count, self.self_cpu, self.total_cpu, self.self_device):
            column.append(0.0)
        return index

    def name_id(self, name: str) -> int:
        """The id of ``name``, added on first sight."""
        index = self.ids.get(name)
        return self.add_name(name) if index is None else index

    def step_marker(self, cat: str, dur: float) -> None:
        """A ``ProfilerStep#N`` event: a profiled step when the profiler annotated it."""
        if cat == "user_annotation":
            self.steps += 1
            self.step_us += dur

    def device_event(self, cat: str, name: str, dur: float) -> None:
        """Count one device event of category ``cat`` towards its kernel's total."""
        self.labels.add(DEVICE_CATEGORIES[cat])
        self.device_events += 1
        index = self.name_id(name)
        self.kernel_us[index] = self.kernel_us.get(index, 0.0) + dur
