"""What both trace passes produce: per-operator window totals and trace-wide facts.

Two views are kept side by side in one pass: *all* (every operator; used when the trace holds
no marked ranges) and *marked* (only what the rules of :mod:`neuron_mlflow.trace.rules` count
inside marked ranges); :meth:`Totals.counted` picks the one that applies. Also the event
categories each backend writes, shared by the passes.

Example:
    >>> totals = Totals()
    >>> totals.name_id("aten::mul"), totals.names, totals.count
    (0, ['aten::mul'], [0.0])
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

from neuron_mlflow.trace.rules import Marks
from neuron_mlflow.trace.shapes import flops, shapes_text

DEVICE_CATEGORIES = {
    "kernel": "CUDA",
    "gpu_memcpy": "CUDA",
    "gpu_memset": "CUDA",
    "cuda_profiler_range": "CUDA",
    "mtia_ccp_events": "MTIA",
    "privateuse1_driver": "NEURON",
    "Kernel": "CUDA",  # PyTorch <= 1.9
    "Memcpy": "CUDA",
    "Memset": "CUDA",
}
RUNTIME_CATEGORIES = {
    "cuda_runtime",
    "cuda_driver",
    "mtia_runtime",
    "privateuse1_runtime",
    "Runtime",  # PyTorch <= 1.9
}
OP_CATEGORIES = {"cpu_op", "user_annotation", "Operator"}  # Operator: PyTorch <= 1.9
MEMORY_DEVICES = {0: "cpu", 1: "cuda", 19: "mtia", 20: "neuron"}
"""c10 ``DeviceType`` numbers of ``[memory]`` events, as metric names (ROCm reports cuda)."""
_COLUMNS = ("count", "self_cpu", "total_cpu", "self_device", "device_total")
"""The per-name-id columns of each view (the marked view's with an ``m_`` prefix)."""


Node = tuple[int, bool, tuple[int, ...], tuple[int, ...]]
"""A call path (``Totals.nodes``): its operator's name id, whether that operator counts in the
marked view, and the name ids that get its device time in their device total, in the
*all* view and in the marked view (an operator folded into its parent is left out)."""


@dataclass
class View:
    """One view's window totals per name id (microseconds), as :func:`_result` reads them."""

    count: list[float]
    self_cpu: list[float]
    total_cpu: list[float]
    self_device: list[float]
    device_total: list[float]
    kernel_us: dict[int, float]
    top_level: int
    device_events: int
    attributed: int
    steps: int
    wall_us: float
    peaks: dict[str, float]


@dataclass
class Totals:
    """Window totals per operator/kernel name id (in microseconds), and trace-wide facts.

    Fields without a prefix are the *all* view; ``m_`` fields the *marked* view. Marker ids
    are negative (``-2 - i`` for ``marker_names[i]``), so the passes tell them apart cheaply.
    Runtime calls (``cudaLaunchKernel``...) have name ids like operators: they are rows.

    Device time is attributed to *call paths* (``node``): an operator with the path of
    operators around it, interned, so their number grows with the program's distinct call
    paths, not with the file. A device event adds its time to its path's operator (self
    device) and to every operator on the path (device total, inclusive as torch's).

    Example:
        >>> totals = Totals()
        >>> totals.name_id("aten::mul"), totals.name_id("aten::add"), totals.name_id("aten::mul")
        (0, 1, 0)
    """

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    count: list[float] = field(default_factory=list)
    self_cpu: list[float] = field(default_factory=list)
    total_cpu: list[float] = field(default_factory=list)
    self_device: list[float] = field(default_factory=list)
    device_total: list[float] = field(default_factory=list)
    kernel_us: dict[int, float] = field(default_factory=dict)
    top_level: int = 0
    span_start: float = math.inf
    span_end: float = -math.inf
    device_events: int = 0
    attributed: int = 0
    busy_pct: float | None = None
    labels: set[str] = field(default_factory=set)
    marks: Marks = field(default_factory=Marks)
    marker_names: list[str] = field(default_factory=list)
    marker_ids: dict[str, int] = field(default_factory=dict)
    m_count: list[float] = field(default_factory=list)
    m_self_cpu: list[float] = field(default_factory=list)
    m_total_cpu: list[float] = field(default_factory=list)
    m_self_device: list[float] = field(default_factory=list)
    m_device_total: list[float] = field(default_factory=list)
    m_kernel_us: dict[int, float] = field(default_factory=dict)
    m_top_level: int = 0
    m_device_events: int = 0
    m_attributed: int = 0
    m_wall_us: float = 0.0
    m_calls: int = 0
    variant_ids: dict[tuple[str, bytes, bytes], int] = field(default_factory=dict)
    shapes: dict[int, str] = field(default_factory=dict)
    flops: dict[int, int] = field(default_factory=dict)
    memory: dict[Any, tuple[array[Any], array[Any], array[Any]]] = field(default_factory=dict)
    step_ranges: list[tuple[float, float]] = field(default_factory=list)  # ProfilerStep#N
    # call path -> its children: ``node_kids[parent + 1][index << 2 | counted << 1 | folded]``
    node_kids: list[dict[int, int]] = field(default_factory=lambda: [{}])
    nodes: list[Node] = field(default_factory=list)

    def _new_id(self, name: str) -> int:
        index = len(self.names)
        self.names.append(name)
        for prefix in ("", "m_"):
            for column in _COLUMNS:
                getattr(self, prefix + column).append(0.0)
        return index

    def new_node(self, parent: int, key: int) -> int:
        """Intern the call path ``key`` (operator name id << 2 | counted in the marked view << 1
        | folded into its parent) under path ``parent``; the caller found it missing from
        ``node_kids[parent + 1]``.

        Example:
            >>> totals = Totals()
            >>> a, b = totals.name_id("aten::linear"), totals.name_id("aten::addmm")
            >>> outer = totals.new_node(-1, a << 2 | 2)
            >>> inner = totals.new_node(outer, b << 2 | 2)
            >>> totals.nodes[inner]
            (1, True, (0, 1), (0, 1))
        """
        index, counted, folded = key >> 2, bool(key & 2), bool(key & 1)
        node = self.node_kids[parent + 1][key] = len(self.nodes)
        self.node_kids.append({})
        chain, m_chain = self.nodes[parent][2:] if parent >= 0 else ((), ())
        if not folded:
            chain = (*chain, index)
            if counted:
                m_chain = (*m_chain, index)
        self.nodes.append((index, counted, chain, m_chain))
        return node

    def name_id(self, name: str) -> int:
        """The id of ``name``, added on first sight with zeroed totals."""
        index = self.ids.get(name)
        if index is None:
            index = self.ids[name] = self._new_id(name)
        return index

    def variant_id(self, name: str, dims: bytes, concrete: bytes) -> int:
        """The id of operator ``name`` called with these inputs (``record_shapes`` traces).

        Each distinct input signature has its own id (merged back by name in the summary),
        with its shapes and FLOPs per call worked out once.
        """
        key = (name, dims, concrete if name == "aten::conv2d" else b"")
        index = self.variant_ids.get(key)
        if index is None:
            index = self.variant_ids[key] = self._new_id(name)
            text = dims.decode("utf-8", "replace")
            self.shapes[index] = shapes_text(text)
            estimate = flops(name, text, concrete.decode("utf-8", "replace") or None)
            if estimate is not None:
                self.flops[index] = estimate
        return index

    def marker_id(self, name: str) -> int:
        """The (negative) id of marker ``name``."""
        index = self.marker_ids.get(name)
        if index is None:
            index = self.marker_ids[name] = -2 - len(self.marker_names)
            self.marker_names.append(name)
        return index

    def memory_event(self, pid: Any, ts: float, device_type: int, allocated: float) -> None:
        """A ``[memory]`` event: the allocator's total on ``device_type`` at ``ts``."""
        columns = self.memory.get(pid)
        if columns is None:
            columns = self.memory[pid] = (array("d"), array("q"), array("d"))
        columns[0].append(ts)
        columns[1].append(device_type)
        columns[2].append(allocated)

    def _peaks(self, marked: bool) -> dict[str, float]:
        peaks: dict[int, float] = {}
        for pid, (times, devices, allocated) in self.memory.items():
            for ts, device, total in zip(times, devices, allocated, strict=True):
                if total > peaks.get(device, -1.0) and (not marked or self.marks.covers(pid, ts)):
                    peaks[device] = total
        return {MEMORY_DEVICES.get(d, f"device{d}"): peak for d, peak in sorted(peaks.items())}

    def counted(self, recorded_steps: int | None = None) -> View:
        """The view that applies: *marked* when the trace holds marked ranges, else *all*.

        Args:
            recorded_steps: the steps a live window recorded (trace metadata): a window cut
                short holds one more step range than that (torch's open one).
        """
        steps = len(self.step_ranges)
        if recorded_steps is not None and 0 < recorded_steps < steps:
            steps = recorded_steps
        if self.marks:
            steps, wall = self.m_calls or steps, self.m_wall_us
        elif steps:
            wall = sum(dur for _, dur in sorted(self.step_ranges)[:steps])
        else:
            wall = max(self.span_end - self.span_start, 0.0)
        prefix = "m_" if self.marks else ""
        view_fields = (*_COLUMNS, "kernel_us", "top_level", "device_events", "attributed")
        return View(
            **{name: getattr(self, prefix + name) for name in view_fields},
            steps=steps or 1,
            wall_us=wall,
            peaks=self._peaks(marked=bool(self.marks)),
        )
