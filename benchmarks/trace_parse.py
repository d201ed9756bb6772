"""Benchmark: the trace engine vs HolisticTraceAnalysis parsing the same files.

Side by side in one invocation, each parse in its own fresh process (so peak memory is that
parse's own): neuron-mlflow's ``summarize_trace`` (streaming read + summary) and HTA's
``parse_trace_dataframe`` (its parser into a DataFrame, default backend), on the real traces
in ``tests/data/traces`` and on generated Kineto-like traces of growing size (CPU ops, runtime
calls and kernels linked by correlation ids). Reports wall seconds, peak RSS (MB) and ratios.

Needs HTA: ``.venv/bin/pip install holistictraceanalysis`` (a benchmark-only dependency).
Run:  .venv/bin/python benchmarks/trace_parse.py [--sizes-mb 50,200,500,1000] [--cpu-first-mb 500]

``--before REV --files A,B --repeat N`` compares instead the trace engine at git revision
``REV`` (exported to a temporary folder) with the working tree's, on the given files (or the
largest file under ``../shared/traces``), each parse ``N`` times in its own fresh process,
alternating before and after; no HTA needed. ``--generated-mb M`` adds a generated trace of
about ``M`` MB with every CPU op first (``generate(path, M, cpu_first=True)``):

    .venv/bin/python benchmarks/trace_parse.py --before b6dd293 --repeat 15 --generated-mb 50
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REAL = sorted((ROOT / "tests" / "data" / "traces").glob("*.json.gz"))


def _step_events(step: int, ts: float) -> list[dict]:
    """One profiler step: a step marker, 40 ops (each with a nested op) launching 40 kernels."""
    events: list[dict] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{step}",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": 1000.0,
            "args": {},
        },
    ]
    t = ts + 1.0
    for i in range(40):
        corr = step * 100 + i
        events += [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"aten::op_{i % 12}",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 20.0,
                "args": {"External id": corr, "Sequence number": corr, "Fwd thread id": 0},
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::empty",
                "pid": 1,
                "tid": 1,
                "ts": t + 1.0,
                "dur": 2.0,
                "args": {"External id": corr},
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": t + 5.0,
                "dur": 4.0,
                "args": {"External id": corr, "correlation": corr},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"void kernel_{i % 12}<float>()",
                "pid": 0,
                "tid": 7,
                "ts": t + 10.0,
                "dur": 15.0,
                "args": {
                    "correlation": corr,
                    "device": 0,
                    "stream": 7,
                    "grid": [1, 1, 1],
                    "block": [128, 1, 1],
                },
            },
            {
                "ph": "f",
                "cat": "ac2g",
                "id": corr,
                "pid": 0,
                "tid": 7,
                "ts": t + 10.0,
                "bp": "e",
                "name": "ac2g",
            },
        ]
        t += 24.0
    return events


def generate(path: Path, size_mb: int, cpu_first: bool = False) -> int:
    """Write a Kineto-like trace of about ``size_mb`` MB; return its event count.

    Events are interleaved step by step, or with ``cpu_first`` every CPU operator comes
    first and the runtime calls and kernels after them (the order Kineto writes).
    """
    one_step = len(",\n".join(json.dumps(e) for e in _step_events(0, 1_000_000.0)))
    steps = size_mb * 1_000_000 // one_step + 1
    everything = {"user_annotation", "cpu_op", "cuda_runtime", "kernel", "ac2g"}
    sweeps = [{"user_annotation", "cpu_op"}, {"cuda_runtime", "kernel", "ac2g"}]
    events = 0
    with path.open("w", encoding="utf-8") as out:
        out.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": [\n')
        separator = ""
        for categories in sweeps if cpu_first else [everything]:
            for step in range(steps):
                lines = _step_events(step, 1_000_000.0 + 1001.0 * step)
                kept = [json.dumps(e) for e in lines if e["cat"] in categories]
                out.write(separator + ",\n".join(kept))
                separator = ",\n"
                events += len(kept)
        out.write("\n]}\n")
    return events


def worker(kind: str, path: str) -> None:
    """Parse once in this process; imports happen before the clock starts."""
    if kind.startswith("neuron-mlflow"):
        if ":" in kind:  # another revision's package, exported by export_revision
            sys.path.insert(0, kind.split(":", 1)[1])
        from neuron_mlflow.trace.summarize import summarize_trace

        start = time.perf_counter()
        summarize_trace(path)
    else:
        import logging

        logging.disable(logging.CRITICAL)
        from hta.common.trace_parser import parse_trace_dataframe
        from hta.configs.parser_config import ParserConfig

        start = time.perf_counter()
        parse_trace_dataframe(path, ParserConfig())
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": peak_mb}))


def measure(kind: str, path: Path) -> dict:
    out = (
        subprocess.run(
            [sys.executable, __file__, "--worker", kind, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return json.loads(out)


def export_revision(rev: str, into: Path) -> Path:
    """The package as it was at git revision ``rev``, in ``into`` (importable from there)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "neuron_mlflow"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def before_and_after(rev: str, files: list[Path], repeat: int) -> None:
    """The trace engine at ``rev`` against the working tree's: the median and the least of
    ``repeat`` fresh-process parses each (time), the largest peak RSS (memory)."""
    import statistics

    print(
        f"| trace | before ({rev}) s, median [min] | after s, median [min] | after / before "
        "| before peak MB | after peak MB | after / before |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as work:
        old = export_revision(rev, Path(work))
        for path in files:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(repeat):
                runs["before"].append(measure(f"neuron-mlflow:{old}", path))
                runs["after"].append(measure("neuron-mlflow", path))
            t = {k: [r["seconds"] for r in v] for k, v in runs.items()}
            m = {k: max(r["peak_mb"] for r in v) for k, v in runs.items()}
            med = {k: statistics.median(v) for k, v in t.items()}
            print(
                f"| {path.name} | {med['before']:.4f} [{min(t['before']):.4f}] "
                f"| {med['after']:.4f} [{min(t['after']):.4f}] "
                f"| {med['after'] / med['before']:.2f} | {m['before']:.1f} | {m['after']:.1f} "
                f"| {m['after'] / m['before']:.2f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mb", default="50,200,500,1000")
    parser.add_argument(
        "--cpu-first-mb",
        default="500",
        help="sizes to generate again with every CPU op first (Kineto's order); '' for none",
    )
    parser.add_argument("--before", help="git revision: its trace engine against this one's")
    parser.add_argument("--files", default="", help="with --before: trace files (default: the "
                        "largest under ../shared/traces)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=15, help="with --before: parses each")
    parser.add_argument("--generated-mb", type=int, default=0, help="with --before: also a "
                        "generated trace of this size, CPU ops first")  # fmt: skip
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if args.before:
        files = [Path(f) for f in args.files.split(",") if f]
        if not files:
            shared = ROOT.parent / "shared" / "traces"
            files = [max(shared.glob("*.json.gz"), key=lambda p: p.stat().st_size)]
        with tempfile.TemporaryDirectory() as work:
            if args.generated_mb:
                path = Path(work) / f"generated_{args.generated_mb}mb_cpu_first.json"
                generate(path, args.generated_mb, cpu_first=True)
                files.append(path)
            before_and_after(args.before, files, args.repeat)
        return
    print(
        "| trace | neuron-mlflow s | HTA s | speed-up | neuron-mlflow peak MB "
        "| HTA peak MB | memory ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as work:
        files: list[tuple[str, Path | tuple[int, bool]]] = [(p.name, p) for p in REAL]
        files += [("", (int(s), False)) for s in args.sizes_mb.split(",") if s]
        files += [("", (int(s), True)) for s in args.cpu_first_mb.split(",") if s]
        for name, source in files:
            if isinstance(source, Path):
                path = source
            else:  # generated when its turn comes, removed after
                size, cpu_first = source
                path = Path(work) / f"generated_{size}mb{'_cpu_first' if cpu_first else ''}.json"
                events = generate(path, size, cpu_first)
                name = f"generated {path.stat().st_size / 1e6:.0f} MB ({events:,} events)"
                name += ", CPU ops first" if cpu_first else ""
            ours, theirs = measure("neuron-mlflow", path), measure("hta", path)
            print(
                f"| {name} | {ours['seconds']:.2f} | {theirs['seconds']:.2f} "
                f"| {theirs['seconds'] / ours['seconds']:.1f}x | {ours['peak_mb']:.0f} "
                f"| {theirs['peak_mb']:.0f} | {ours['peak_mb'] / theirs['peak_mb']:.2f} |",
                flush=True,
            )
            if path.parent == Path(work):
                path.unlink()


if __name__ == "__main__":
    main()
