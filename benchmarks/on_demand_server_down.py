"""Benchmark: a tracking server that stops answering mid-fit costs the fit nothing.

A Lightning fit on CPU (``tests/engine/capture_job.py fixed``: 1000 steps of 5 ms, no
scheduled window, no Lightning logger, so that only neuron-mlflow talks to the server) runs
against a real ``mlflow server`` behind a TCP proxy in this process:

- ``polling off``: ``poll_s=0``;
- ``server up``: ``poll_s=--poll-s`` (1 s), the server answers throughout;
- ``server hangs``: the same; once the job has its run, the proxy accepts connections but
  never answers (the worst case: no refusal, only time-outs).

Each variant runs ``--rounds`` times, interleaved, each in a fresh process; reported is the
median fit time (``trainer.fit``, teardown included) and its ratio to ``polling off`` (the
bar: within 5 %).

Run:  .venv/bin/python benchmarks/on_demand_server_down.py [--rounds 3] [--poll-s 1.0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import running_mlflow_server  # noqa: E402
from tests.engine.proxy import Proxy  # noqa: E402

JOB = ROOT / "tests" / "engine" / "capture_job.py"


def fit_once(uri: str, poll_s: float, proxy: Proxy | None) -> float:
    work = Path(tempfile.mkdtemp())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(JOB), uri, "server-down", str(work), "fixed", str(poll_s)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    if proxy is not None:
        while not (work / "run_id").exists() and proc.poll() is None:
            time.sleep(0.05)
        proxy.hang = True
    out, _ = proc.communicate(timeout=600)
    if proxy is not None:
        proxy.hang = False
    (fit,) = [float(line[6:]) for line in out.splitlines() if line.startswith("FIT_S=")]
    return fit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--poll-s", type=float, default=1.0)
    args = parser.parse_args()
    with running_mlflow_server(Path(tempfile.mkdtemp())) as uri:
        proxy = Proxy(int(uri.rsplit(":", 1)[1]))
        proxied = f"http://127.0.0.1:{proxy.port}"
        times: dict[str, list[float]] = {"polling off": [], "server up": [], "server hangs": []}
        for _ in range(args.rounds):
            times["polling off"].append(fit_once(proxied, 0, None))
            times["server up"].append(fit_once(proxied, args.poll_s, None))
            times["server hangs"].append(fit_once(proxied, args.poll_s, proxy))
    base = statistics.median(times["polling off"])
    print("| variant | fit time (s, median) | vs polling off |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median / base:.3f}x |")


if __name__ == "__main__":
    main()
