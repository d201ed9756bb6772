"""Metric keys and artifact paths: the one place where every public name is built.

The grammar (``P`` is the metric prefix, ``<key>`` an op key from :func:`op_keys`):

==========================================  =====================================================
name                                        meaning
==========================================  =====================================================
``P/device_time_us``                        self device time per profiled step (sum over ops)
``P/cpu_time_us``                           self CPU time per profiled step (sum over ops)
``P/wall_time_us``                          wall-clock time per profiled step
``P/op_calls``                              top-level operator dispatches per profiled step
``P/steps``                                 profiled steps in the window
``P/op/<key>/self_device_us``               self device time of one op per step
``P/op/<key>/self_cpu_us``                  self CPU time of one op per step
``P/op/<key>/calls``                        calls of one op per step
``P/op/<key>/device_pct``                   share of the window's device time (%)
``P/step_<first:06d>-<last:06d>/``          artifact folder of one window
==========================================  =====================================================

Example:
    >>> metric_key("profile", "op", "aten.mul", "self_cpu_us")
    'profile/op/aten.mul/self_cpu_us'
    >>> window_artifact_path("profile/rmsnorm", 3, 7)
    'profile/rmsnorm/step_000003-000007'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from neuron_mlflow.summary.ops import OpSummary

MAX_KEY_CHARS = 120
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.\-]+")


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]


def safe_op_key(name: str) -> str:
    """Make an op name safe for a metric key, before de-duplication.

    ``::`` becomes ``.``, each run of characters outside ``[A-Za-z0-9_.-]`` becomes one
    ``_``, and leading and trailing ``_``/``.`` are stripped.

    Example:
        >>> safe_op_key("aten::mul")
        'aten.mul'
        >>> safe_op_key("Torch-Compiled Region: 0/0")
        'Torch-Compiled_Region_0_0'
    """
    return _UNSAFE_RUN.sub("_", name.replace("::", ".")).strip("_.")


def op_keys(names: Iterable[str]) -> dict[str, str]:
    """Assign every op name of one window a unique, MLflow-safe key.

    The key is :func:`safe_op_key` of the name; if that is empty, longer than 120 characters
    or already used by another op of the window, ``_`` and the first 8 hex digits of the
    SHA-1 of the original name are appended. Names whose safe form equals the name itself
    are assigned first, then the rest in sorted order, so the result does not depend on the
    order of ``names``.

    Args:
        names: op names of one window (duplicates are ignored).

    Returns:
        A mapping from op name to key.

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
            key = f"{key[:MAX_KEY_CHARS]}_{_digest(name)}"
        taken.add(key)
        keys[name] = key
    return keys


def metric_key(prefix: str, *parts: str) -> str:
    """Join the prefix and parts of a metric key with ``/``.

    Example:
        >>> metric_key("profile/train", "device_time_us")
        'profile/train/device_time_us'
    """
    return "/".join((prefix, *parts))


def window_artifact_path(prefix: str, first: int, last: int) -> str:
    """Artifact folder of the window whose recorded steps are ``first`` to ``last``.

    Example:
        >>> window_artifact_path("profile", 0, 2)
        'profile/step_000000-000002'
    """
    return f"{prefix}/step_{first:06d}-{last:06d}"


def trace_folder(rank: int) -> str:
    """Folder, inside a window's artifact folder, holding one rank's profiler output.

    Example:
        >>> trace_folder(3)
        'traces/rank_3'
    """
    return f"traces/rank_{rank}"


def window_metrics(summary: OpSummary, prefix: str, top_k: int) -> dict[str, float]:
    """Every metric of one window, named by the grammar in this module's docstring.

    Device metrics are present only when device time was measured; per-op metrics only for
    the first ``top_k`` operators of the summary.

    Args:
        summary: the window's summary.
        prefix: the metric prefix ``P``.
        top_k: how many operators get per-op metrics.

    Returns:
        Metric name to value.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
        >>> sorted(window_metrics(s, "profile", top_k=5))  # doctest: +NORMALIZE_WHITESPACE
        ['profile/cpu_time_us', 'profile/op/aten.mul/calls', 'profile/op/aten.mul/self_cpu_us',
         'profile/op_calls', 'profile/steps', 'profile/wall_time_us']
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
    return metrics
