"""Read run profiles back from MLflow: the metric prefixes of a run and its latest window.

Example:
    >>> profile_prefixes(["profile/op_calls", "loss"])
    ['profile']
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_mlflow.errors import CompareError
from neuron_mlflow.summary.comparison import HEADLINE, RunProfile


def profile_prefixes(metric_names: Iterable[str]) -> list[str]:
    """The metric prefixes ``P`` of a run: every ``P`` with a ``P/op_calls`` metric.

    Example:
        >>> profile_prefixes(["profile/train/op_calls", "profile/train/op/aten.mm/calls",
        ...                   "profile/train/rank/0/op_calls", "loss"])
        ['profile/train']
    """
    return sorted(
        name[: -len("/op_calls")]
        for name in metric_names
        if name.endswith("/op_calls") and "/op/" not in name and "/rank/" not in name
    )


def _latest_summary(client: Any, run_id: str, prefix: str) -> dict | None:
    try:
        folders = [a.path for a in client.list_artifacts(run_id, prefix) if a.is_dir]
        windows = sorted(f for f in folders if f.rsplit("/", 1)[-1].startswith("step_"))
        if not windows:
            return None
        with tempfile.TemporaryDirectory(prefix="neuron-mlflow-profile-") as tmp:
            local = client.download_artifacts(run_id, f"{windows[-1]}/summary.json", tmp)
            return json.loads(Path(local).read_text())
    except Exception:
        return None


def load_profile(client: Any, run_id: str, prefix: str | None = None) -> RunProfile:
    """Read the latest profile of ``run_id`` (under ``prefix``, or the run's only/first one).

    Raises:
        CompareError: the run does not exist or has no profile metrics.
    """
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise CompareError(f"run {run_id!r} was not found at {client.tracking_uri}") from exc
    metrics = run.data.metrics
    prefixes = profile_prefixes(metrics)
    if not prefixes:
        raise CompareError(
            f"run {run_id!r} has no profile metrics (no '<prefix>/op_calls' metric); "
            "profile it with neuron_mlflow first"
        )
    if prefix is None:
        prefix = prefixes[0]
    elif prefix not in prefixes:
        raise CompareError(
            f"run {run_id!r} has no metrics under prefix {prefix!r}; it has: {', '.join(prefixes)}"
        )
    headline = {
        name: metrics[f"{prefix}/{name}"] for name in HEADLINE if f"{prefix}/{name}" in metrics
    }
    ops: dict[str, dict[str, float]] = {}
    summary = _latest_summary(client, run_id, prefix)
    if summary is not None:
        for op in summary["summary"]["ops"]:
            ops[op["name"]] = {
                k: op[k]
                for k in ("self_device_us", "self_cpu_us", "calls")
                if op.get(k) is not None
            }
    else:
        start = f"{prefix}/op/"
        for name, value in metrics.items():
            if name.startswith(start):
                key, field_name = name[len(start) :].rsplit("/", 1)
                if field_name in ("self_device_us", "self_cpu_us", "calls"):
                    ops.setdefault(key, {})[field_name] = value
    return RunProfile(
        run_id=run_id,
        name=run.info.run_name or run_id,
        prefix=prefix,
        headline=headline,
        ops=ops,
        backend=run.data.tags.get("neuron_mlflow.backend"),
        prefixes=prefixes,
    )
