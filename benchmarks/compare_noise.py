"""A/A and A/B: does ``neuron-mlflow compare --fail-above 10`` tell a real change from noise?

The same profiled function (``nm.profile``, CPU backend: ``N`` matrix multiplies a step) runs in
separate processes, one after another and interleaved (a run of each group a turn, as the main
job interleaves its variants), each its own MLflow run with 3 windows of 20 steps
(``Schedule(wait=5, warmup=2, active=20, repeat=3)``), into one SQLite store. Then
``neuron-mlflow compare CAND --baseline BASE --fail-above 10 --format json`` runs over
ordered pairs of runs (the gate on the headline time, self CPU time here):

- **A/A**: ``--runs`` runs of 20 multiplies, every ordered pair (6 runs: 30 pairs): how many
  are flagged as regressions (exit 1; the bar: at most 1 of 30);
- **A/B**: the candidate does 1.3x the work (26 multiplies; ``--runs - 1`` runs) against each
  A run: how many are flagged (the bar: at least 29 of 30), and which ops the table marks
  ``regression``: ``aten::mm``, the one that changed (and ``aten::resolve_conj``, which
  ``aten::mm`` calls three times a call on CPU: it changed too), no other;
- **1.05x** (21 multiplies; 3 runs): never flagged as a regression.

Run it (about 4 minutes on a 2-core host)::

    .venv/bin/python benchmarks/compare_noise.py            # 6 runs a side, the full bar
    .venv/bin/python benchmarks/compare_noise.py --busy     # with a CPU-bound process beside
    .venv/bin/python benchmarks/compare_noise.py --runs 3   # quicker (what the test runs)
    .venv/bin/python benchmarks/compare_noise.py --probe --busy  # which signal finds the
                                                                 # disturbed steps

``--busy`` runs ``python -c "while True: pass"`` beside the whole benchmark (a neighbour that
holds a core). ``--probe`` measures, per step of the RMSNorm main job's naive variant (256 x
1024, torch's default threads), what separates the steps that took over 3x the median from
those within 1.5x of it: the run-queue wait of the process's threads (over 5 % of the step)
and involuntary context switches (``neuron_mlflow/capture/interference.py``).

Prints one line per group and a JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_MATMULS = 20
CHANGED = {"aten::mm", "aten::resolve_conj"}  # the ops a step of N multiplies calls N times


def worker(matmuls: int, experiment: str, size: int, spool: str) -> None:
    """One run: the profiled function, 3 windows of 20 steps (in this process)."""
    import mlflow
    import torch

    import neuron_mlflow as nm

    torch.set_num_threads(1)
    torch.manual_seed(0)
    a = torch.randn(size, size)
    b = torch.randn(size, size)

    def work() -> torch.Tensor:
        out = a
        for _ in range(matmuls):
            out = torch.mm(a, b)
        return out

    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"mm{matmuls}") as run:
        schedule = nm.Schedule(wait=5, warmup=2, active=20, repeat=3)
        profiled = nm.profile(schedule=schedule, backend="cpu", local_dir=spool)(work)
        for _ in range(5):  # first calls (allocator, kernels) outside any window
            work()
        for _ in range(3 * (5 + 2 + 20)):
            profiled()
        profiled.profiler.session.wait(120)
        print(run.info.run_id)


def _spawn(matmuls: int, experiment: str, size: int, uri: str, spool: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT))
    args = ["--worker", str(matmuls), "--experiment", experiment, "--size", str(size)]
    out = subprocess.run(
        [sys.executable, __file__, *args, "--spool", spool],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return out.stdout.strip().splitlines()[-1]


def _compare(base: str | list[str], cand: str | list[str]) -> tuple[int, dict]:
    from neuron_mlflow.cli import main

    bases = [base] if isinstance(base, str) else base
    cands = [cand] if isinstance(cand, str) else cand
    args = ["compare", *cands, "--baseline", *bases, "--fail-above", "10", "--format", "json"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    if code == 2 or not out.getvalue().strip():
        raise RuntimeError(
            f"compare {cand} --baseline {base} exited {code}: {err.getvalue()[-2000:]}"
        )
    return code, json.loads(out.getvalue())


def _marked(data: dict, cand: str) -> list[str]:
    return [
        row["op"]
        for row in data["ops"]
        if row.get("estimate", {}).get(cand, {}).get("verdict") == "regression"
    ]


def run_benchmark(runs: int, size: int, uri: str, spool: str) -> dict:
    """Run the A/A, A/B and 1.05x groups; return the counts (see the module docstring)."""
    started = time.monotonic()
    counts = {"aa": runs, "ab": max(runs - 1, 1), "ac": 3 if runs >= 3 else 1}
    matmuls = {"aa": BASE_MATMULS, "ab": 26, "ac": 21}
    spawned: dict[str, list[str]] = {group: [] for group in counts}
    for turn in range(runs):  # interleaved, a run of each group a turn: a slow minute of the
        for group, count in counts.items():  # machine falls on every group, not on one
            if turn < count:
                spawned[group].append(_spawn(matmuls[group], group, size, uri, spool))
    a_runs, b_runs, c_runs = spawned["aa"], spawned["ab"], spawned["ac"]
    os.environ["MLFLOW_TRACKING_URI"] = uri
    result: dict = {"runs": runs, "size": size, "matmuls": [BASE_MATMULS, 26, 21]}
    codes, ratios = [], []
    for base, cand in itertools.permutations(a_runs, 2):
        code, data = _compare(base, cand)
        codes.append(code)
        ratios.append(data["estimates"][cand][data["time_metric"]])
    result["aa"] = {
        "pairs": len(codes),
        "regressions": codes.count(1),
        "insufficient": codes.count(3),
        "passed": codes.count(0),
        "ratios": [round(e["ratio"], 3) for e in ratios],
        "intervals": [[round(e["low"] or 0, 3), round(e["high"] or 0, 3)] for e in ratios],
    }
    codes, marked, estimates = [], [], []
    for base, cand in itertools.product(a_runs, b_runs):
        code, data = _compare(base, cand)
        codes.append(code)
        marked.append(_marked(data, cand))
        estimates.append(data["estimates"][cand][data["time_metric"]])
    result["ab"] = {
        "pairs": len(codes),
        "regressions": codes.count(1),
        "marked_mm": sum(1 for m in marked if "aten::mm" in m and set(m) <= CHANGED),
        "marked": sorted({op for m in marked for op in m}),
        "ratios": [round(e["ratio"], 3) for e in estimates],
        "lows": [round(e["low"] or 0, 3) for e in estimates],
    }
    codes, estimates = [], []
    for base, cand in itertools.product(a_runs, c_runs):
        code, data = _compare(base, cand)
        codes.append(code)
        estimates.append(data["estimates"][cand][data["time_metric"]])
    verdicts = [e["verdict"] for e in estimates]
    result["small"] = {
        "pairs": len(codes),
        "regressions": codes.count(1),
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        "ratios": [round(e["ratio"], 3) for e in estimates],
    }
    # several runs a side (the remedy for process-to-process differences): the 1.05x runs
    # pooled against the A runs pooled, the bootstrap drawing runs as well as steps
    code, data = _compare(a_runs, c_runs)
    pooled = next(iter(data["estimates"].values()))[data["time_metric"]]
    result["small_pooled"] = {
        "exit": code,
        "verdict": pooled["verdict"],
        "ratio": round(pooled["ratio"], 3),
        "interval": [round(pooled["low"] or 0, 3), round(pooled["high"] or 0, 3)],
    }
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


@contextlib.contextmanager
def busy_neighbour(on: bool):  # type: ignore[no-untyped-def]
    """A CPU-bound process beside the block (``--busy``), stopped after it."""
    if not on:
        yield
        return
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        neighbour.kill()
        neighbour.wait()


def probe(steps: int = 600) -> dict:
    """Per step: wall time, run-queue wait and involuntary switches (module docstring)."""
    import torch

    from neuron_mlflow.capture.interference import InterferenceProbe

    x, w = torch.randn(256, 1024), torch.randn(1024)

    def naive() -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    for _ in range(20):
        naive()
    found = InterferenceProbe()
    found.open()
    rows = []
    for _ in range(steps):
        start = found.sample()
        began = time.perf_counter_ns()
        naive()
        wall = (time.perf_counter_ns() - began) / 1e3
        wait, switches = found.since(start)
        rows.append((wall, wait or 0.0, switches))
    found.close()
    median = sorted(r[0] for r in rows)[len(rows) // 2]
    out: dict = {"steps": steps, "median_us": round(median, 1), "threads": torch.get_num_threads()}
    for name, low, high in (("fast", 0.0, 1.5), ("middle", 1.5, 3.0), ("slow", 3.0, 1e12)):
        group = [r for r in rows if low * median < r[0] <= high * median]
        out[name] = {
            "steps": len(group),
            "wait_over_5pct": sum(1 for r in group if r[1] >= 0.05 * r[0] and r[1] > 0),
            "switched": sum(1 for r in group if r[2] > 0),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="A runs (6: 30 ordered pairs)")
    parser.add_argument("--size", type=int, default=96, help="matrix size")
    parser.add_argument("--worker", type=int, metavar="MATMULS", help=argparse.SUPPRESS)
    parser.add_argument("--experiment", default="aa", help=argparse.SUPPRESS)
    parser.add_argument("--spool", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tracking-uri", default=None, help="default: a new SQLite store")
    parser.add_argument("--busy", action="store_true", help="a CPU-bound process beside it")
    parser.add_argument("--probe", action="store_true", help="what finds disturbed steps")
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.experiment, args.size, args.spool)
        return 0
    if args.probe:
        with busy_neighbour(args.busy):
            found = probe()
        for name in ("fast", "middle", "slow"):
            group = found[name]
            print(
                f"{name}: {group['steps']} steps, run-queue wait >= 5 %: "
                f"{group['wait_over_5pct']}, involuntary switch: {group['switched']}"
            )
        print(json.dumps(found))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="compare-noise-"))
    uri = args.tracking_uri or f"sqlite:///{tmp / 'mlflow.db'}"
    with busy_neighbour(args.busy):
        result = run_benchmark(args.runs, args.size, uri, str(tmp / "spool"))
    result["busy"] = args.busy
    aa, ab, small = result["aa"], result["ab"], result["small"]
    print(
        f"A/A: {aa['regressions']} of {aa['pairs']} pairs flagged ({aa['insufficient']} "
        f"insufficient data, {aa['passed']} passed)"
    )
    print(
        f"A/B 1.3x: {ab['regressions']} of {ab['pairs']} flagged; aten::mm (with its "
        f"children only) marked in {ab['marked_mm']}"
    )
    print(
        f"1.05x: {small['regressions']} of {small['pairs']} flagged; verdicts {small['verdicts']}"
    )
    pooled = result["small_pooled"]
    print(
        f"1.05x, runs pooled a side: {pooled['verdict']} {pooled['ratio']}x {pooled['interval']} "
        f"(exit {pooled['exit']})"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
