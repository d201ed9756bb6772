"""The seed's case study: RMSNorm three ways, profiled into MLflow and compared side by side.

One parent run; one nested child run per variant, each profiled with ``neuron_mlflow.profile``
on the same input, configuration and schedule:

- ``naive``: five separate ops (mul, mean, add, rsqrt, mul);
- ``rms_norm``: ``torch.rms_norm`` (one fused op);
- ``compiled``: the naive function under ``torch.compile(fullgraph=True)`` (the Neuron
  backend for torch.compile on Trainium, the default backend elsewhere).

The parent run gets ``comparison.md`` (the seed's side-by-side table, then the changes
against the first variant), ``comparison.html`` (the same as a picture) and the headline
metrics per variant; the table is printed at the end. Run it with::

    python recipes/rmsnorm.py --rows 64 --hidden 256 --variants naive,rms_norm
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import mlflow
import torch

import neuron_mlflow as nm

VARIANTS = ("naive", "rms_norm", "compiled")
EPS = 1e-6


def rmsnorm_naive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RMSNorm from separate ops, as in the seed."""
    x_sq = x * x
    mean_sq = x_sq.mean(-1, keepdim=True)
    inv = torch.rsqrt(mean_sq + EPS)
    return x * inv * w


def rmsnorm_fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.rms_norm``: one fused op."""
    return torch.rms_norm(x, (x.shape[-1],), w, EPS)


def variant_fn(variant: str, device: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The function profiled for ``variant``."""
    if variant == "naive":
        return rmsnorm_naive
    if variant == "rms_norm":
        return rmsnorm_fused
    backend = "neuron" if device == "neuron" else "inductor"
    return torch.compile(rmsnorm_naive, backend=backend, fullgraph=True)


def _device(backend: str) -> str:
    if backend == "neuron" or (backend == "auto" and hasattr(torch, "neuron")):
        return "neuron"
    if backend == "cuda" or (backend == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--active", type=int, default=5)
    parser.add_argument("--backend", default="auto", choices=["auto", "neuron", "cuda", "cpu"])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--experiment", default="rmsnorm")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"--variants: unknown {unknown}; allowed: {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = _device(args.backend)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.rows, args.hidden, dtype=dtype, device=device)
    w = torch.randn(args.hidden, dtype=dtype, device=device)
    schedule = nm.Schedule(warmup=args.warmup, active=args.active)
    config = nm.ProfilerConfig(backend=args.backend, schedule=schedule)
    if "MLFLOW_RUN_ID" not in os.environ:  # under `mlflow run`, its run and experiment
        mlflow.set_experiment(args.experiment)
    summaries: dict[str, nm.OpSummary] = {}
    runs: dict[str, tuple[str, nm.OpSummary]] = {}
    with mlflow.start_run(run_name="rmsnorm") as parent:
        mlflow.log_params({k: getattr(args, k) for k in ("rows", "hidden", "dtype", "backend")})
        for variant in args.variants:
            with mlflow.start_run(run_name=variant, nested=True) as child:
                profiled = nm.profile(config=config)(variant_fn(variant, device))
                for _ in range(args.warmup + args.active):
                    profiled(x, w)
                summary = profiled.profiler.summary
                if summary is None:
                    print(f"{variant}: no window was captured", file=sys.stderr)
                    return 1
                summaries[variant] = summary
                runs[variant] = (child.info.run_id, summary)
        table = nm.render_side_by_side(summaries)
        markdown, page = nm.comparison_report(runs, title="RMSNorm variants")
        mlflow.log_text(markdown, "comparison.md")
        mlflow.log_text(page, "comparison.html")
        for variant, s in summaries.items():
            values = {"cpu_time_us": s.cpu_time_us, "op_calls": s.op_calls}
            values["wall_time_us"] = s.wall_time_us
            if s.device_time_us is not None:
                values["device_time_us"] = s.device_time_us
            mlflow.log_metrics({f"comparison/{variant}/{k}": v for k, v in values.items()})
        print(table)
        print(f"parent run: {parent.info.run_id} at {mlflow.get_tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
