"""Benchmark: the time to build a window's report.html, beside the summary it accompanies.

Both run on the worker thread after a window closes (never in the training step): the
summary (``summarize_trace``, the trace engine) and the report (``build_timeline`` over the
same trace + ``render_report`` + write). Side by side on the real traces in
``tests/data/traces`` (and ``../shared/traces``) and on generated Kineto-like traces of
growing size (``benchmarks/trace_parse.py``'s generator); the report's size and how many bars
its budget kept. Best of ``--repeat`` runs for files under 10 MB.

Run:  .venv/bin/python benchmarks/report_build.py [--sizes-mb 20,100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trace_parse import generate  # noqa: E402
from neuron_mlflow.summary.report import render_report  # noqa: E402
from neuron_mlflow.trace.summarize import summarize_trace  # noqa: E402
from neuron_mlflow.trace.timeline import build_timeline  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def measure(path: Path, repeat: int) -> dict:
    repeat = repeat if path.stat().st_size < 10 << 20 else 1
    summary_s, result = _best(lambda: summarize_trace(path), repeat)
    out = Path(tempfile.mkdtemp()) / "report.html"

    def report() -> dict:
        timeline = build_timeline(path).to_dict()
        text = render_report(result.summary, {"window": "steps 0-1"}, timeline)  # type: ignore[attr-defined]
        out.write_text(text, encoding="utf-8")
        return timeline

    report_s, timeline = _best(report, repeat)
    kept = len(timeline["events"]["dur_us"])  # type: ignore[index]
    return {
        "file": path.name,
        "trace_mb": path.stat().st_size / 1e6,
        "events": timeline["total_events"],  # type: ignore[index]
        "summary_s": summary_s,
        "report_s": report_s,
        "report_mb": out.stat().st_size / 1e6,
        "bars": kept,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="20,100")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    real = {
        p.name: p
        for d in (ROOT / "tests/data/traces", ROOT.parent / "shared/traces")
        if d.is_dir()
        for p in d.glob("*.json.gz")
    }
    files = sorted(real.values(), key=lambda p: p.stat().st_size)
    work = Path(tempfile.mkdtemp(prefix="report-bench-"))
    for size in (int(s) for s in args.sizes_mb.split(",") if s):
        path = work / f"generated_{size}mb.json"
        generate(path, size)
        files.append(path)
    print(
        "| trace | size (MB) | events | summary (s) | report (s) | report / summary |"
        " report.html (MB) | bars kept |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in files:
        r = measure(path, args.repeat)
        print(
            f"| {r['file']} | {r['trace_mb']:.2f} | {r['events']:,} | {r['summary_s']:.3f} "
            f"| {r['report_s']:.3f} | {r['report_s'] / r['summary_s']:.1f}x "
            f"| {r['report_mb']:.2f} | {r['bars']:,} |",
            flush=True,
        )
        if path.parent == work:
            path.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
