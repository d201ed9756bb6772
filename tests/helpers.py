"""Shared helpers for the tests: the seed's RMSNorm variants and MLflow read-back."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from mlflow import MlflowClient

HIDDEN = 64
EPS = 1e-6


def rmsnorm_naive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The seed's naive RMSNorm: mul, mean, add, rsqrt, mul, mul (6 top-level dispatches)."""
    x_sq = x * x
    mean_sq = x_sq.mean(-1, keepdim=True)
    inv = torch.rsqrt(mean_sq + EPS)
    return x * inv * w


def rmsnorm_fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.rms_norm``: one top-level dispatch."""
    return torch.rms_norm(x, (x.shape[-1],), w, EPS)


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
