"""Metric keys, artifact paths, tags and markers: the one place where every public name is
built. The grammar of the metric keys and what each means: ``docs/metrics.md``.

Example:
    >>> metric_key("profile", "op", "aten.mul", "self_cpu_us")
    'profile/op/aten.mul/self_cpu_us'
    >>> window_artifact_path("profile/rmsnorm", 3, 7), trace_folder(3)
    ('profile/rmsnorm/step_000003-000007', 'traces/rank_3')
    >>> run_tag("backend"), param_key("profile/train", "schedule.active")
    ('neuron_mlflow.backend', 'profile/train/config/schedule.active')
    >>> partial_tag("P/step_000000-000001"), reason_tag("P/step_000000-000001")
    ('neuron_mlflow.partial/P/step_000000-000001', 'neuron_mlflow.reason/P/step_000000-000001')
    >>> busy_metric("profile"), call_marker("rmsnorm")
    ('profile/device_busy_pct', 'neuron_mlflow: rmsnorm')
    >>> neuron_metric_key("profile", "summary", "n_1f2e", "tensor_engine_active_time_percent")
    'profile/neuron/summary/n_1f2e/tensor_engine_active_time_percent'
    >>> system_metric_key("core_0", "utilization_pct")
    'system/neuron/core_0/utilization_pct'
    >>> capture_status_tag(1), heartbeat_tag(0)
    ('neuron_mlflow.capture.status.rank.1', 'neuron_mlflow.capture.heartbeat.rank.0')
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from neuron_mlflow.summary.ops import OpSummary

MAX_KEY_CHARS = 120
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.\-]+")

# Marker names in traces (the counting rules: neuron_mlflow/trace/rules.py).
STEP_MARKER_PREFIX = "ProfilerStep"
"""torch.profiler's ``ProfilerStep#N`` range around each profiled step (never an operator)."""
CALL_MARKER_PREFIX = "neuron_mlflow: "
"""Prefix of our ``record_function`` ranges: each decorated call, each Lightning training step."""
TRAIN_STEP_MARKER = CALL_MARKER_PREFIX + "train_step"
"""The callback's range around each training step (``on_train_batch_start`` to ``_end``)."""
RECORDED_STEPS_KEY = "neuron_mlflow_recorded_steps"
"""Trace metadata: the steps a live window recorded (a window cut short holds one more
``ProfilerStep`` range, torch's open one, than the steps it recorded)."""
STEP_INTERFERENCE_KEY = "neuron_mlflow_step_interference"
"""Trace metadata: per recorded step ``[cpu_wait_us, involuntary_switches]`` (a JSON list;
``capture/interference.py``), read into ``steps.jsonl``."""


def safe_op_key(name: str) -> str:
    """Make an op name safe for a metric key, before de-duplication (docs/metrics.md)."""
    return _UNSAFE_RUN.sub("_", name.replace("::", ".")).strip("_.")


def op_keys(names: Iterable[str]) -> dict[str, str]:
    """Assign every op name of one window (duplicates ignored) a unique, MLflow-safe key,
    whatever the order of ``names`` (the rule: docs/metrics.md).

    Example:
        >>> keys = op_keys(["a b", "a_b", "#"])
        >>> keys["a_b"], keys["a b"], keys["#"]
        ('a_b', 'a_b_7dbde935', '_d08f88df')
    """
    unique = set(names)
    order = sorted(unique, key=lambda n: (safe_op_key(n) != n, n))
    taken: set[str] = set()
    keys: dict[str, str] = {}
    for name in order:
        key = safe_op_key(name)
        if not key or len(key) > MAX_KEY_CHARS or key in taken:
            digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
            key = f"{key[:MAX_KEY_CHARS]}_{digest}"
        taken.add(key)
        keys[name] = key
    return keys


def metric_key(prefix: str, *parts: str) -> str:
    """Join the prefix and parts of a metric key with ``/``."""
    return "/".join((prefix, *parts))


def window_artifact_path(prefix: str, first: int, last: int) -> str:
    """Artifact folder of the window whose recorded steps are ``first`` to ``last``."""
    return f"{prefix}/step_{first:06d}-{last:06d}"


def trace_folder(rank: int) -> str:
    """Folder, inside a window's artifact folder, holding one rank's profiler output."""
    return f"traces/rank_{rank}"


REPORT_FILE = "report.html"  # a window's interactive report, next to its summary.md
COMPARISON_HTML, COMPARISON_MARKDOWN = "comparison.html", "comparison.md"  # compare --log-to
TAG_PREFIX = "neuron_mlflow."
"""Every run tag of ours starts with this."""
JOB_TAG = f"{TAG_PREFIX}job_id"
"""The job a run belongs to (every rank's windows of one job land in one run)."""
CONFIG_CHANGED_TAG = f"{TAG_PREFIX}config_changed"
"""``<this>/<prefix>``: a later window's config differs from the run's params."""
DEVICE_TIME_SOURCE_TAG = f"{TAG_PREFIX}device_time_source"
"""Where the device time came from: ``trace``, ``key_averages`` or ``none``."""


def run_tag(name: str) -> str:
    """Our run tag ``name`` (``backend``, ``host``, ``rank``...)."""
    return TAG_PREFIX + name


STEPS_FILE = "steps.jsonl"  # a window's per-step samples (neuron_mlflow/trace/step_samples.py)
STEP_STATS_KEY = "step_stats"
"""Key, in ``OpSummary.extra``, of the per-step median and IQR of the headline times."""
HOST_LOAD_TAGS = {
    name: f"{TAG_PREFIX}host_load.{name}"
    for name in ("load_avg_1m", "cpu_steal_pct", "cpu_count", "torch_threads")
}
"""Run tags of the host's load during a window (``engine/host_load.py``; ``compare`` warns
when two sides differ)."""


def window_metrics(summary: OpSummary, prefix: str, top_k: int) -> dict[str, float]:
    """Every metric of one window (``docs/metrics.md``), per-op ones for the first ``top_k``.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
        >>> sorted(window_metrics(s, "profile", top_k=5))  # doctest: +NORMALIZE_WHITESPACE
        ['profile/cpu_time_us', 'profile/op/aten.mul/calls', 'profile/op/aten.mul/self_cpu_us',
         'profile/op_calls', 'profile/steps', 'profile/wall_time_us']
        >>> s = build_summary([RawOp("aten::mm", 1, 4.0, 4.0, flops=2e6)], 1, 1, 10.0,
        ...                   peak_allocated_bytes={"cpu": 4096.0})
        >>> metrics = window_metrics(s, "P", top_k=5)
        >>> sorted((k, v) for k, v in metrics.items() if "flops" in k or "memory" in k)
        ... # doctest: +NORMALIZE_WHITESPACE
        [('P/achieved_tflops', 0.2), ('P/flops_per_step', 2000000.0),
         ('P/memory/cpu/peak_allocated_bytes', 4096.0),
         ('P/memory/peak_allocated_bytes', 4096.0), ('P/op/aten.mm/flops', 2000000.0)]
    """
    metrics = {
        metric_key(prefix, "cpu_time_us"): summary.cpu_time_us,
        metric_key(prefix, "wall_time_us"): summary.wall_time_us,
        metric_key(prefix, "op_calls"): summary.op_calls,
        metric_key(prefix, "steps"): float(summary.steps),
    }
    if summary.device_time_us is not None:
        metrics[metric_key(prefix, "device_time_us")] = summary.device_time_us
    keys = op_keys(op.name for op in summary.ops)
    for op in summary.top(top_k):
        key = keys[op.name]
        metrics[metric_key(prefix, "op", key, "self_cpu_us")] = op.self_cpu_us
        metrics[metric_key(prefix, "op", key, "calls")] = op.calls
        if op.self_device_us is not None:
            metrics[metric_key(prefix, "op", key, "self_device_us")] = op.self_device_us
            metrics[metric_key(prefix, "op", key, "device_pct")] = op.device_pct or 0.0
        if op.flops is not None:
            metrics[metric_key(prefix, "op", key, "flops")] = op.flops
    peaks = summary.peak_allocated_bytes
    if peaks:
        main = next((device for device in peaks if device != "cpu"), "cpu")
        metrics[metric_key(prefix, "memory", "peak_allocated_bytes")] = peaks[main]
        for device, peak in peaks.items():
            metrics[metric_key(prefix, "memory", device, "peak_allocated_bytes")] = peak
    if summary.flops_per_step is not None:
        metrics[metric_key(prefix, "flops_per_step")] = summary.flops_per_step
        if summary.wall_time_us > 0:
            tflops = summary.flops_per_step / summary.wall_time_us / 1e6  # FLOP/us -> TFLOP/s
            metrics[metric_key(prefix, "achieved_tflops")] = tflops
    for name, stats in (summary.extra.get(STEP_STATS_KEY) or {}).items():
        metrics[metric_key(prefix, f"{name}_p50")] = stats["p50"]  # per-step median
        metrics[metric_key(prefix, f"{name}_iqr")] = stats["iqr"]  # and spread
    return metrics


def param_key(prefix: str, field_name: str) -> str:
    """Param name of one configuration field, logged once per prefix and run."""
    return metric_key(prefix, "config", field_name)


def partial_tag(artifact_path: str) -> str:
    """Run tag set to ``"true"`` on a window cut short before its last scheduled step."""
    return f"neuron_mlflow.partial/{artifact_path}"


def reason_tag(artifact_path: str) -> str:
    """Run tag saying why a window was taken: ``schedule``, ``request <id>``,
    ``slow steps: 1.7x median``."""
    return f"neuron_mlflow.reason/{artifact_path}"


def rank_metrics(prefix: str, rank: int, summary: OpSummary) -> dict[str, float]:
    """One rank's headline metrics: ``P/rank/<r>/device_time_us`` (else ``cpu_time_us``) and
    ``P/rank/<r>/wall_time_us``.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 1, 4.0, 4.0)], 1, 1, 10.0)
        >>> rank_metrics("profile", 1, s)
        {'profile/rank/1/cpu_time_us': 4.0, 'profile/rank/1/wall_time_us': 10.0}
    """
    if summary.device_time_us is not None:
        name, time_us = "device_time_us", summary.device_time_us
    else:
        name, time_us = "cpu_time_us", summary.cpu_time_us
    return {
        metric_key(prefix, "rank", str(rank), name): time_us,
        metric_key(prefix, "rank", str(rank), "wall_time_us"): summary.wall_time_us,
    }


def busy_metric(prefix: str) -> str:
    """``P/device_busy_pct``: the share of the window's wall time the device was busy."""
    return metric_key(prefix, "device_busy_pct")


def call_marker(name: str) -> str:
    """The ``record_function`` range name around one profiled call of ``name``."""
    return CALL_MARKER_PREFIX + name


def neuron_metric_key(prefix: str, *parts: str) -> str:
    """``P/neuron/<parts>``: a Neuron Explorer number, each part made MLflow-safe."""
    return metric_key(prefix, "neuron", *(safe_op_key(part) or "_" for part in parts))


def system_metric_key(*parts: str) -> str:
    """``system/neuron/<parts>``: a neuron-monitor sample, named like MLflow's system metrics."""
    return "/".join(("system", "neuron", *(safe_op_key(part) or "_" for part in parts)))


CAPTURE_REQUEST_TAG = "neuron_mlflow.capture.request"
"""Run tag holding a capture request (JSON: ``id``, ``steps``, ``warmup``, ``at_step``)."""

CAPTURE_FILE = "capture"
"""``<local_dir>/capture``: a capture request as a file (the same JSON, or empty)."""

STEP_TIME_METRIC = "system/step_time_s"
"""Mean step time (seconds) over each poll interval, logged by the background thread."""


def capture_status_tag(rank: int) -> str:
    """Run tag where rank ``rank`` answers capture requests (accepted, done, refused)."""
    return f"neuron_mlflow.capture.status.rank.{rank}"


def heartbeat_tag(rank: int) -> str:
    """Run tag with rank ``rank``'s heartbeat (JSON: step, steps_per_s, poll_s, time)."""
    return f"neuron_mlflow.capture.heartbeat.rank.{rank}"
