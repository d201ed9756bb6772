"""Benchmark: a whole ``Trainer.fit`` with 4 profiled windows, tracking server up vs down.

Side by side in one run, interleaved round by round, each fit in a fresh Python process: the
wall time of ``trainer.fit`` (teardown included: it hands the windows to the worker process,
which uploads them; ``callback.wait()`` after it, not timed) of a tiny Lightning model with
``NeuronProfilerCallback`` (CPU backend, 4 windows), with the tracking URI pointing at

- ``up``: a real ``mlflow server`` on localhost;
- ``refused``: nothing listens (the server is down);
- ``hanging``: a stub that accepts connections and never answers.

Also counts what the fit left in the spool: every window is either uploaded (``up``) or
pending for ``neuron-mlflow sync`` (down), never lost.

Run:  .venv/bin/python benchmarks/fit_server_down.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port, running_mlflow_server  # noqa: E402
from tests.sinks.stubs import hanging_server  # noqa: E402

CHILD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
import neuron_mlflow as nm
from neuron_mlflow.sinks.spool import Spool
callback = nm.NeuronProfilerCallback(
    backend="cpu", strict=False, local_dir=sys.argv[1],
    schedule=nm.Schedule(wait=2, warmup=1, active=3, repeat=4),
)
trainer = Trainer(
    max_steps=30, callbacks=[callback], logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    accelerator="cpu",
)
started = time.perf_counter()
trainer.fit(BoringModel())
elapsed = time.perf_counter() - started
callback.wait()  # (not timed) the worker's uploads, or its giving up on them
records = [r for r in Spool(sys.argv[1]).windows() if r.manifest.get("kind") != "rank_metrics"]
print(json.dumps({"s": elapsed, "windows": len(records),
                  "statuses": sorted({r.status for r in records})}))
"""


def fit(uri: str, local_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, local_dir],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (root / "server").mkdir()
        uris = {
            "up": stack.enter_context(running_mlflow_server(root / "server")),
            "refused": f"http://127.0.0.1:{free_port()}",
            "hanging": stack.enter_context(hanging_server()).uri,
        }
        for i in range(args.rounds):
            names = list(uris)[i % 3 :] + list(uris)[: i % 3]  # rotate the order
            for name in names:
                results.setdefault(name, []).append(fit(uris[name], str(root / f"{name}{i}")))
                time.sleep(0.5)
    up = statistics.median(r["s"] for r in results["up"])
    print(f"Trainer.fit, 30 steps, 4 windows; median of {args.rounds} rounds\n")
    print("| server | fit (s) | ratio to up | windows in the spool | their status |")
    print("|---|---:|---:|---:|---|")
    for name, runs in results.items():
        med = statistics.median(r["s"] for r in runs)
        windows = {r["windows"] for r in runs}
        statuses = sorted({s for r in runs for s in r["statuses"]})
        print(f"| {name} | {med:.2f} | {med / up:.2f} | {windows} | {', '.join(statuses)} |")


if __name__ == "__main__":
    main()
