"""Shared helpers for the tests: the seed's RMSNorm variants and MLflow read-back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from mlflow import MlflowClient

# The seed's RMSNorm variants: naive (6 top-level dispatches) and torch.rms_norm (1).
from recipes.rmsnorm import rmsnorm_fused, rmsnorm_naive  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 64


def run_python(
    args: list[str], tracking_uri: str, cwd: Path | None = None, **extra_env: str
) -> str:
    """Run ``python ARGS`` as a user would: a clean environment pointed at ``tracking_uri``,
    the venv's ``bin`` on PATH (for ``mlflow run``), plus ``extra_env``; assert it succeeds;
    return stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra_env)
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def parent_and_children(client: MlflowClient, experiment: str) -> tuple[str, dict[str, str]]:
    """The experiment's one parent run and its nested child runs by name."""
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {
        r.info.run_name: r.info.run_id
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    return parent.info.run_id, children


def inputs(rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(rows, HIDDEN), torch.randn(HIDDEN)


def metrics(run_id: str) -> dict[str, float]:
    return MlflowClient().get_run(run_id).data.metrics


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient().get_metric_history(run_id, key)]


def artifact_files(run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of the run (recursively), as paths relative to the run root."""
    client = MlflowClient()
    out: list[str] = []
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            out.extend(artifact_files(run_id, info.path))
        else:
            out.append(info.path)
    return sorted(out)


def download_json(run_id: str, path: str, dest: Path) -> dict:
    local = MlflowClient().download_artifacts(run_id, path, str(dest))
    return json.loads(Path(local).read_text())


def wait_handled(local_dir: str | Path, timeout_s: float = 60.0) -> None:
    """Wait until the worker process is done with every window spooled under ``local_dir``
    (its manifest says ``handled``), e.g. after a job raised before its session closed."""
    import time

    from neuron_mlflow.sinks.spool import Spool

    queue = Path(local_dir) / ".queue"
    deadline = time.monotonic() + timeout_s
    # a window whose job is queued may not be in place yet: the worker puts it there
    while list(queue.glob("*.json")) or not all(
        r.manifest.get("handled") for r in Spool(local_dir).windows()
    ):
        assert time.monotonic() < deadline, f"the worker did not finish {local_dir} in time"
        time.sleep(0.05)


def spooled_places(local_dir: str | Path) -> set[str]:
    """Where every window that ended is, or will be, under ``local_dir``: in place, or staged
    with its record queued for the worker (which puts it in place). The queue is read
    first: a window leaves it only once it is in place."""
    from neuron_mlflow.engine.worker import queued_place, read_job
    from neuron_mlflow.sinks.spool import Spool

    root = Path(local_dir)
    places = set()
    for job_file in (root / ".queue").glob("*.json"):
        try:
            places.add(str(queued_place(root, read_job(root, job_file))))
        except (OSError, ValueError):
            continue  # taken by the worker meanwhile: in place now
    return places | {str(r.path) for r in Spool(root).windows()}


def inject_worker_failure(monkeypatch, tmp_path: Path, target: str, message: str) -> None:
    """Make ``target`` (``module:function``) raise ``RuntimeError(message)`` in the worker
    processes started from now on (a ``sitecustomize`` on their ``PYTHONPATH``)."""
    module, function = target.split(":")
    folder = tmp_path / "inject"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        f"import {module} as _m\n"
        f"def _broken(*args, **kwargs):\n    raise RuntimeError({message!r})\n"
        f"_m.{function} = _broken\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
