"""Read run profiles back from MLflow (what is read: docs/comparing.md, "What is kept"). Only
what MLflow says does not exist is absent: any other failure is raised as an
``MlflowException``, never a verdict from part of a run's windows.

Example:
    >>> profile_prefixes(["profile/op_calls", "loss"])
    ['profile']
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from neuron_mlflow.errors import CompareError
from neuron_mlflow.naming import HOST_LOAD_TAGS, STEPS_FILE, run_tag
from neuron_mlflow.summary.comparison import (
    HEADLINE,
    OP_FIELDS,
    SAMPLED,
    Comparison,
    RunProfile,
    RunSamples,
    compare_profiles,
    op_series,
    stable_op_names,
)
from neuron_mlflow.trace.step_samples import read_step_samples

T = TypeVar("T")


@contextlib.contextmanager
def quiet_downloads() -> Iterator[None]:
    """MLflow's artifact download progress bars (one per file, on stderr) off in the block.

    Example:
        >>> import os
        >>> with quiet_downloads():
        ...     os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"]
        'false'
    """
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def is_not_found(exc: BaseException) -> bool:
    """Whether an MLflow error says ``RESOURCE_DOES_NOT_EXIST`` (any other error is a failure
    of the server, not a wrong id).

    Example:
        >>> from mlflow.exceptions import MlflowException
        >>> from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
        >>> is_not_found(MlflowException("gone", error_code=RESOURCE_DOES_NOT_EXIST))
        True
        >>> is_not_found(MlflowException("API request failed"))  # INTERNAL_ERROR
        False
    """
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.error_code == "RESOURCE_DOES_NOT_EXIST"


def existing_run(
    client: Any, run_id: str, what: str = "run", error: type[Exception] = CompareError
) -> Any:
    """``client.get_run(run_id)``; a run that does not exist is an ``error`` that names
    ``what``, the run and the server; any other failure stays an ``MlflowException``."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if not is_not_found(exc):
            raise
        raise error(f"{what} {run_id!r} was not found at {client.tracking_uri}") from exc


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


def _unless_missing(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``call(*args, **kwargs)``, None when MLflow says it does not exist, any other failure
    an ``MlflowException``.

    Example:
        >>> from mlflow.exceptions import MlflowException
        >>> from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
        >>> def gone():
        ...     raise MlflowException("gone", error_code=RESOURCE_DOES_NOT_EXIST)
        >>> _unless_missing(gone) is None
        True
        >>> _unless_missing(int, "x")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mlflow.exceptions.MlflowException: ValueError: invalid literal for int() ...
    """
    from mlflow.exceptions import MlflowException

    try:
        return call(*args, **kwargs)
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise
    except Exception as exc:  # e.g. requests' HTTPError of an artifact listing
        raise MlflowException(f"{type(exc).__name__}: {exc}") from exc


def _read(client: Any, uri: str, tmp: str) -> str | None:
    """The text of the artifact at ``uri`` (fetched from the run's artifact store itself:
    ``client.download_artifacts`` reads every failure as "no such path")."""
    from mlflow.artifacts import download_artifacts

    local = _unless_missing(
        download_artifacts, artifact_uri=uri, dst_path=tmp, tracking_uri=client.tracking_uri
    )
    try:
        return None if local is None else Path(local).read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a bad file, not a failure of MLflow
        return None


def _window_samples(
    client: Any, run_id: str, root: str, window: str, tmp: str
) -> tuple[dict[str, list[float]], dict[str, str], dict[str, Any] | None, tuple[int, int]]:
    """One window (``root``: the run's artifact URI): series -> per-step values of its
    undisturbed steps (none when all were disturbed), raw op name -> key, its summary.json,
    and (disturbed steps, steps) of its ``steps.jsonl``."""
    listed = _unless_missing(client.list_artifacts, run_id, window) or []
    files = {a.path.rsplit("/", 1)[-1] for a in listed}
    text = _read(client, f"{root}/{window}/summary.json", tmp) if "summary.json" in files else None
    summary = None
    with contextlib.suppress(ValueError, KeyError, TypeError):  # none, or not a summary
        summary = json.loads(text)["summary"]  # type: ignore[arg-type]
    series: dict[str, list[float]] = {}
    keys: dict[str, str] = {}
    counted = (0, 0)
    text = _read(client, f"{root}/{window}/{STEPS_FILE}", tmp) if STEPS_FILE in files else None
    if text:
        every, ops = read_step_samples(text)
        every.sort(key=lambda r: r["step"])
        heads = [r for r in every if r.get("disturbed") is not True]
        counted = (len(every) - len(heads), len(every))
        for metric in SAMPLED:  # a series, empty when every step was disturbed
            if any(r.get(metric) is not None for r in every):
                series[metric] = [float(r[metric]) for r in heads if r.get(metric) is not None]
        by_op: dict[str, dict[int, dict[str, Any]]] = {}
        for row in ops:
            keys[row["op"]] = row.get("key") or row["op"]
            by_op.setdefault(keys[row["op"]], {})[row["step"]] = row
        for key, rows in by_op.items():
            for field_name in OP_FIELDS:
                if any(row.get(field_name) is not None for row in rows.values()):
                    series[op_series(key, field_name)] = [
                        float(rows.get(h["step"], {}).get(field_name) or 0.0) for h in heads
                    ]
    elif summary is not None:  # a window logged before steps.jsonl: its mean, one value
        for metric in SAMPLED:
            if summary.get(metric) is not None:
                series[metric] = [float(summary[metric])]
        keys = stable_op_names(op["name"] for op in summary.get("ops") or [])
        for op in summary.get("ops") or []:
            for field_name in OP_FIELDS:
                if op.get(field_name) is not None:
                    series[op_series(keys[op["name"]], field_name)] = [float(op[field_name])]
    return series, keys, summary, counted


def _history_samples(
    client: Any, run_id: str, prefix: str, metrics: dict[str, float]
) -> RunSamples:
    """A run without window artifacts: one value per logged window, from the metric history."""
    samples: RunSamples = {}
    for metric in SAMPLED:
        key = f"{prefix}/{metric}"
        if key not in metrics:
            continue
        history = _unless_missing(client.get_metric_history, run_id, key)
        ordered = sorted(history or [], key=lambda m: (m.step, m.timestamp))
        samples[metric] = [[metrics[key]]] if history is None else [[m.value] for m in ordered]
    for key, fields in _logged_ops(prefix, metrics).items():
        samples.update({op_series(key, name): [[value]] for name, value in fields.items()})
    return samples


def _logged_ops(prefix: str, metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """The run's ``P/op/<key>/<field>`` metrics as op key -> field -> value."""
    ops: dict[str, dict[str, float]] = {}
    start = f"{prefix}/op/"
    for name, value in metrics.items():
        if name.startswith(start):
            key, field_name = name[len(start) :].rsplit("/", 1)
            if field_name in OP_FIELDS:
                ops.setdefault(key, {})[field_name] = value
    return ops


def _read_run(
    client: Any, run: Any, prefix: str, metrics: dict[str, float]
) -> tuple[RunSamples, dict[str, dict[str, float]], tuple[int, int]]:
    """Every window's samples of the run, the latest window's ops (for display), and
    (disturbed steps, steps) over its windows."""
    samples: RunSamples = {}
    ops: dict[str, dict[str, float]] = {}
    disturbed = steps = 0
    run_id, root = run.info.run_id, run.info.artifact_uri
    listed = _unless_missing(client.list_artifacts, run_id, prefix) or []
    windows = sorted(
        a.path for a in listed if a.is_dir and a.path.rsplit("/", 1)[-1].startswith("step_")
    )
    with tempfile.TemporaryDirectory(prefix="neuron-mlflow-profile-") as tmp:
        latest: tuple[dict[str, str], dict[str, Any] | None] = ({}, None)
        for window in windows:
            series, keys, summary, counted = _window_samples(client, run_id, root, window, tmp)
            disturbed, steps = disturbed + counted[0], steps + counted[1]
            for name, values in series.items():
                samples.setdefault(name, []).append(values)
            if summary is not None:
                latest = (keys, summary)
    keys, summary = latest
    if summary is not None:
        stable = stable_op_names(op["name"] for op in summary.get("ops") or [])
        for op in summary.get("ops") or []:
            key = keys.get(op["name"]) or stable[op["name"]]
            ops[key] = {k: op[k] for k in OP_FIELDS if op.get(k) is not None}
    else:
        ops = _logged_ops(prefix, metrics)
    if not samples and not steps:
        samples = _history_samples(client, run_id, prefix, metrics)
    return samples, ops, (disturbed, steps)


def load_profile(client: Any, run_id: str, prefix: str | None = None) -> RunProfile:
    """The profile of ``run_id`` under ``prefix`` (default: its first): the latest values and
    every window's samples.

    Raises:
        CompareError: the run does not exist or has no profile metrics.
        MlflowException: MLflow failed otherwise (e.g. the server could not be reached, or
            failed while the run's windows were read).
    """
    run = existing_run(client, run_id)
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
    with quiet_downloads():
        samples, ops, (disturbed, steps) = _read_run(client, run, prefix, metrics)
    tags = {
        short: run.data.tags[tag] for short, tag in HOST_LOAD_TAGS.items() if tag in run.data.tags
    }
    return RunProfile(
        run_id=run_id,
        name=run.info.run_name or run_id,
        prefix=prefix,
        headline=headline,
        ops=ops,
        backend=run.data.tags.get(run_tag("backend")),
        prefixes=prefixes,
        samples=[samples],
        tags=tags,
        run_ids=[run_id],
        steps_disturbed=disturbed,
        steps_read=steps,
    )


def load_profiles(
    client: Any, run_ids: Iterable[str], prefix: str | None = None
) -> dict[str, RunProfile]:
    """The profiles of ``run_ids`` by run: under ``prefix``, else each run's first, or, when
    those differ, the first prefix they all have (if any).

    Raises:
        CompareError: a run does not exist or has no profile metrics.
        MlflowException: MLflow failed while reading a run.
    """
    unique = list(dict.fromkeys(run_ids))
    loaded = {r: load_profile(client, r, prefix) for r in unique}
    if prefix is None and len({p.prefix for p in loaded.values()}) > 1:
        shared = set.intersection(*(set(p.prefixes) for p in loaded.values()))
        if shared:
            loaded = {r: load_profile(client, r, sorted(shared)[0]) for r in unique}
    return loaded


def compare_runs(
    run_ids: Sequence[str],
    baseline: str | None = None,
    top: int = 20,
    margin_pct: float | None = None,
    client: Any = None,
) -> Comparison:
    """Compare MLflow runs by their profiles: what ``neuron-mlflow compare RUN...`` computes,
    as a :class:`~neuron_mlflow.summary.comparison.Comparison` (its ``outcome`` is the one
    answer; its ``render`` and
    :func:`~neuron_mlflow.sinks.comparison_files.publish_comparison` show it).

    Args:
        run_ids: the runs, one side each (the first is the baseline unless ``baseline``).
        baseline: the baseline run.
        top: operators compared.
        margin_pct: the verdicts' margin (default 5 %).
        client: an ``MlflowClient`` (default: one for the current tracking URI).

    Raises:
        CompareError: a run does not exist or has no profile metrics.
        MlflowException: MLflow failed while reading a run (e.g. the server failed midway).

    Example:
        >>> import tempfile
        >>> from mlflow import MlflowClient
        >>> store = MlflowClient(f"sqlite:///{tempfile.mkdtemp()}/mlflow.db")
        >>> compare_runs(["no-such-run"], client=store)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        neuron_mlflow.errors.CompareError: run 'no-such-run' was not found at sqlite:///...
    """
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    loaded = load_profiles(client, run_ids)
    profiles = [loaded[run_id] for run_id in run_ids]
    return compare_profiles(profiles, baseline=baseline, top=top, margin_pct=margin_pct)
