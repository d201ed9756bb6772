"""The seed's case study: RMSNorm three ways, profiled into MLflow and compared side by side.

One parent run; one nested child run per variant, each profiled with ``neuron_mlflow.profile``
on the same input, configuration and schedule:

- ``naive``: five separate ops (mul, mean, add, rsqrt, mul);
- ``rms_norm``: ``torch.rms_norm`` (one fused op);
- ``compiled``: the naive function under ``torch.compile(fullgraph=True)`` (the Neuron
  backend for torch.compile on Trainium, the default backend elsewhere).

The parent run is named after what it compared and when (``rmsnorm naive|rms_norm|compiled
2026-12-04 14:02``) and carries the headline as columns for the runs list: the tag ``result``
(e.g. ``compiled fastest: 1.31x vs naive (self CPU time, improvement)``), the tag ``fastest``
and the metric ``speedup``. The parent run gets ``comparison.md`` (the seed's side-by-side
table, then the changes against the first variant), ``comparison.html`` (the same as a
picture) and the headline metrics per variant; the table is printed at the end. Run it with::

    python recipes/rmsnorm.py --rows 64 --hidden 256 --variants naive,rms_norm
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
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


def headline(
    summaries: dict[str, nm.OpSummary],
    ratios: dict[str, float] | None = None,
    verdicts: dict[str, str] | None = None,
) -> tuple[str, str, float]:
    """The fastest variant, its speedup and the sentence for the runs list.

    Times are device time when every variant has one, else self CPU time (the time metric of
    ``neuron-mlflow compare``): ``compare``'s ratios to the first variant (the baseline) when
    every variant has one (``ratios``, with its ``verdicts``), else the last windows' means.
    The speedup is against the baseline, or against the runner-up when the baseline is fastest.
    """
    baseline = next(iter(summaries))
    measure = "device time"
    if all(s.device_time_us is not None for s in summaries.values()):
        times = {v: s.device_time_us or 0.0 for v, s in summaries.items()}
    else:
        measure, times = "self CPU time", {v: s.cpu_time_us for v, s in summaries.items()}
    verdicts = verdicts or {}
    if ratios and all(v in ratios for v in summaries if v != baseline):
        times = {baseline: 1.0, **{v: ratios[v] for v in summaries if v != baseline}}
    ranked = sorted(summaries, key=lambda v: times[v])
    fastest = ranked[0]
    if len(ranked) == 1:
        return fastest, f"{fastest} only: nothing to compare", 1.0
    other = baseline if baseline != fastest else ranked[1]
    speedup = times[other] / max(times[fastest], 1e-12)
    judged = fastest if fastest != baseline else other
    if judged in verdicts:
        measure += f", {judged}: {verdicts[judged]}" if judged == other else f", {verdicts[judged]}"
    return fastest, f"{fastest} fastest: {speedup:.2f}x vs {other} ({measure})", speedup


def conclude(runs: dict[str, tuple[str, nm.OpSummary]]) -> list[str]:
    """Each variant against the first, decided by ``neuron-mlflow compare`` from every step of
    every window: ``rms_norm vs naive: 0.41x [0.37, 0.45], improvement``. The verdicts go on
    the active (parent) run as tags, the ratios and bounds as metrics."""
    import contextlib
    import io
    import json

    from neuron_mlflow.cli import main as cli

    names = list(runs)
    lines = []
    for variant in names[1:]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli(["compare", runs[variant][0], "--baseline", runs[names[0]][0], "--format", "json"])
        data = json.loads(out.getvalue())
        e = data["estimates"][runs[variant][0]][data["time_metric"]]
        mlflow.set_tag(f"verdict/{variant}", e["verdict"])
        if e["ratio"] is not None:
            mlflow.log_metric(f"ratio/{variant}", e["ratio"])
        line = f"{variant} vs {names[0]}: "
        if e["low"] is None:
            line += f"insufficient data ({e['reason']}): raise --active or --repeat"
        else:
            mlflow.log_metrics(
                {f"ratio_low/{variant}": e["low"], f"ratio_high/{variant}": e["high"]}
            )
            line += f"{e['ratio']:.2f}x [{e['low']:.2f}, {e['high']:.2f}], {e['verdict']}"
            if e["verdict"] == "insufficient data":
                line += " (interval too wide: raise --active or --repeat, or run it again)"
        lines.append(f"{line} ({data['time_metric']}, 10th percentile step)")
    return lines


def ui_hint(tracking_uri: str, experiment_id: str) -> str:
    """How to open the runs list of ``experiment_id`` (the command, then the URL)."""
    runs = f"#/experiments/{experiment_id}/runs"
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')}/{runs}"
    return f"mlflow ui --backend-store-uri {tracking_uri}, then open http://127.0.0.1:5000/{runs}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--active", type=int, default=20, help="steps a window (20)")
    parser.add_argument("--repeat", type=int, default=3, help="windows a variant (3)")
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
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:  # MLflow's own switch; set it to see INFO
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    device = _device(args.backend)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.rows, args.hidden, dtype=dtype, device=device)
    w = torch.randn(args.hidden, dtype=dtype, device=device)
    schedule = nm.Schedule(warmup=args.warmup, active=args.active, repeat=args.repeat)
    config = nm.ProfilerConfig(backend=args.backend, schedule=schedule)
    if "MLFLOW_RUN_ID" not in os.environ:  # under `mlflow run`, its run and experiment
        mlflow.set_experiment(args.experiment)
    summaries: dict[str, nm.OpSummary] = {}
    runs: dict[str, tuple[str, nm.OpSummary]] = {}
    name = f"rmsnorm {'|'.join(args.variants)} {time.strftime('%Y-%m-%d %H:%M')}"
    with mlflow.start_run(run_name=name) as parent:
        mlflow.log_params({k: getattr(args, k) for k in ("rows", "hidden", "dtype", "backend")})
        for number, variant in enumerate(args.variants, 1):
            with mlflow.start_run(run_name=variant, nested=True) as child:
                fn = variant_fn(variant, device)
                for _ in range(3):  # compilation and first calls stay outside the windows
                    fn(x, w)
                profiled = nm.profile(config=config)(fn)
                for _ in range((args.warmup + args.active) * args.repeat):
                    profiled(x, w)
                summary = profiled.profiler.summary
                if summary is None:
                    print(f"{variant}: no window was captured", file=sys.stderr)
                    return 1
                # the next variant is not measured while our worker uploads this one
                profiled.profiler.close()
                profiled.profiler.wait()
                summaries[variant] = summary
                runs[variant] = (child.info.run_id, summary)
                print(
                    f"[{number}/{len(args.variants)}] {variant}: {summary.cpu_time_us:.0f} us self"
                    f" CPU per step, {summary.op_calls:g} top-level calls"
                    f" (run {child.info.run_id})",
                    flush=True,
                )
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
        for line in conclude(runs):  # the statistics: ratio, interval, verdict per variant
            print(line)
        decided = mlflow.get_run(parent.info.run_id).data  # conclude()'s ratios and verdicts
        ratios = {v: decided.metrics[f"ratio/{v}"] for v in runs if f"ratio/{v}" in decided.metrics}
        verdicts = {v: decided.tags[f"verdict/{v}"] for v in runs if f"verdict/{v}" in decided.tags}
        fastest, result, speedup = headline(summaries, ratios, verdicts)
        mlflow.set_tags({"result": result, "fastest": fastest})
        mlflow.log_metric("speedup", round(speedup, 3))  # a readable column
        print(table)
        print(f"{result}; parent run {name!r} ({parent.info.run_id})")
        print(f"See it in the UI: {ui_hint(mlflow.get_tracking_uri(), parent.info.experiment_id)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
