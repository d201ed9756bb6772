"""Benchmark: the step that ends a profiling window, and the steps after it, ours against raw
``torch.profiler``, for the context manager (``nm.profile``) and the Lightning callback.

Side by side in one invocation, interleaved round by round (the order of the three variants
rotates), each measurement in a fresh Python process. Two front ends:

- ``decorator``: ``nm.profile`` as a context manager (the decorator's engine) around a loop of
  ``step()`` calls, against a raw ``torch.profiler.profile`` stepped the same way;
- ``lightning``: ``nm.NeuronProfilerCallback`` on a CPU ``Trainer`` (``logger=False``: the
  callback opens its own MLflow run), against a plain Lightning ``Callback`` whose
  ``on_train_batch_end`` calls ``prof.step()`` on a raw ``torch.profiler.profile``.

The raw profiler has the same schedule (``wait=5, warmup=1, active=<steps>``) and an
``on_trace_ready`` that calls ``export_chrome_trace``. Each step runs ``<ops>`` small CPU aten
ops (a loop of ``x = x + 1; x.mul_(0.5)`` on 8 floats; under Lightning inside
``training_step``, plus a tiny real loss). Timed, per process:

- **hook**: the call that ends the window: ``prof.step()`` (decorator), or the profiler
  callback's ``on_train_batch_end`` (Lightning: two timing callbacks, just before and just
  after it, read ``perf_counter``). Ours stops the profiler, lets torch export the trace into
  the spool and writes the window's record into the queue of the worker process (started
  when the first window opens); the raw one stops and exports.
- **after**: the ``--after`` (20) steps right after the window, end of step to end of step
  (every hook and the data loading included), while our worker process summarises and
  uploads the window.

Each process then ends normally (ours reads the window's summary, which waits for its worker,
not timed); the next process starts once the worker has exited.
The MLflow store is one SQLite file in a temp folder (``MLFLOW_TRACKING_URI``), created before
the first round. Windows: small (50 ops x 5 steps), large (600 ops x 20 steps) and, in
Lightning only, a small transformer (4 layers, d=256, sequence 128, batch 8; a 5-step
window). Reports medians over the rounds and the ratio ours/raw of the medians. Targets
(issue #33): hook <= 1.25x raw (small), <= 1.1x (large, transformer); steps after <= 1.05x.

A third variant is the control for the steps after: the raw profiler with another process
(idle class, like our worker) parsing JSON on the other CPU from the window's end until the
steps after are done. What the steps after lose beside it is what any process working
beside the training thread costs on this machine (a VM's two vCPUs can share one physical
core), whatever that process is. The last column is the steps around the window's open
(its warm-up step begins: the profiler starts, and ours makes the files its end writes).

Run:  .venv/bin/python benchmarks/window_end.py [--mode both|decorator|lightning] [--rounds 5]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {"small": (50, 5), "large": (600, 20), "transformer": (0, 5)}
"""Window sizes: (ops per step, active steps); ``transformer`` (Lightning only): a small
transformer's training step (:data:`TRANSFORMER`) instead of the small ops."""
TRANSFORMER = {"layers": 4, "d_model": 256, "heads": 4, "sequence": 128, "batch": 8}
"""The third size: a small transformer encoder trained on random inputs, on the CPU."""
WAIT = 5
"""Steps before the window's warm-up step (the process warms up there)."""
EXPERIMENT = "window-end-benchmark"
VARIANTS = ["ours", "raw", "busy"]
"""ours; the raw profiler; the raw profiler with a busy process beside the steps after."""


def work(ops: int, x):
    """One step's ``ops`` small CPU operators (two per iteration); returns ``x``."""
    for _ in range(ops // 2):
        x = x + 1.0
        x.mul_(0.5)
    return x


def raw_profiler(steps: int, folder: Path):
    """A raw torch.profiler with the same schedule, exporting its trace when ready."""
    import torch.profiler

    path = folder / "raw.pt.trace.json"
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=WAIT, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ), path


def our_config(steps: int, folder: Path) -> dict:
    import neuron_mlflow as nm

    return {
        "backend": "cpu",
        "schedule": nm.Schedule(wait=WAIT, warmup=1, active=steps),
        "local_dir": str(folder / "spool"),
        "experiment_name": EXPERIMENT,
    }


class Probe:
    """CPU seconds while the steps after the window ran: this (training) thread's, and the
    worker process's (started in the hook; read from ``/proc``, 0 for the raw profiler)."""

    def __init__(self) -> None:
        self.worker_pid: int | None = None
        self.thread_cpu: list[float] = []
        self.worker_cpu_s = 0.0

    def watch_worker(self) -> None:
        """Note the worker's pid when ours starts it (observed, not replaced)."""
        from neuron_mlflow.engine import worker

        start = getattr(worker, "start_worker", None)
        if start is None:  # the engine moved: the worker's CPU column reads 0
            return

        def observed(root):
            popen = start(root)
            self.worker_pid = popen.pid
            return popen

        worker.start_worker = observed

    busy: Busy | None = None

    def sample(self, index: int, last: int, after: int) -> None:
        if index in (last, last + after):
            self.thread_cpu.append(time.thread_time())
        if self.busy is not None and index == last:
            self.busy.start()
        if self.busy is not None and index == last + after:
            self.busy.stop()
        if index == last + after and self.worker_pid is not None:
            try:
                fields = Path(f"/proc/{self.worker_pid}/stat").read_text().rsplit(")", 1)[1]
                utime, stime = fields.split()[11:13]
                self.worker_cpu_s = (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError):
                self.worker_cpu_s = float("nan")


BUSY_CODE = """
import json, os, sys
from neuron_mlflow.engine.worker import run_idle
run_idle(os.getpid())  # the class our worker runs in
fd = int(sys.argv[1])
os.read(fd, 1)  # the window ended
text = json.dumps([{"name": "aten::add", "ts": i, "dur": 1.5, "args": {}} for i in range(20000)])
os.set_blocking(fd, False)
if sys.argv[2] == "disk":  # commits to a SQLite file, as MLflow's local store does
    import sqlite3, tempfile
    db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "busy.db"))
    db.execute("create table t (v text)")
if sys.argv[2] == "write":  # a trace compressed into a new file and the old one removed,
    import gzip, tempfile  # as our worker does with a window's trace
    folder = tempfile.mkdtemp()
    big = (text * 8).encode()
if sys.argv[2] == "memory":  # fresh memory touched and given back, as imports and parsing do
    import mmap
if sys.argv[2] == "import":  # what our worker imports first (MLflow, our upload path), once
    import mlflow
    import neuron_mlflow.engine.pipeline
    import neuron_mlflow.sinks.mlflow_sink
    os.set_blocking(fd, True)
    os.read(fd, 1)
    sys.exit(0)
while True:
    if sys.argv[2] == "memory":
        block = mmap.mmap(-1, 64 << 20)
        for offset in range(0, 64 << 20, 4096):
            block[offset] = 1
        block.close()
    elif sys.argv[2] == "write":
        target = os.path.join(folder, "trace.json.gz")
        with gzip.open(target, "wb", compresslevel=1) as out:
            out.write(big)
        os.remove(target)
    elif sys.argv[2] == "disk":
        db.execute("insert into t values (?)", (text[:200],))
        db.commit()
    else:
        json.loads(text)  # trace-parsing work, as our worker does
    try:
        if os.read(fd, 1) in (b"x", b""):
            break
    except BlockingIOError:
        pass
"""


BUSY_ENV = "NEURON_MLFLOW_BENCH_BUSY"
LEAD_ENV = "NEURON_MLFLOW_BENCH_LEAD_S"


def lead() -> None:
    """``--lead-s``: sleep before the first step (every variant), after our session started
    its worker: the worker's one-time imports are then done before the window opens."""
    time.sleep(float(os.environ.get(LEAD_ENV, "0")))


class Busy:
    """The control for the steps after: another process that parses JSON on the other CPU
    from the window's end until the steps after are done (started before the window, in
    the idle class like our worker). What the steps after lose beside it is what any
    process working beside the training thread costs on this machine."""

    def __init__(self) -> None:
        read, self.write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", BUSY_CODE, str(read), os.environ.get(BUSY_ENV, "cpu")],
            pass_fds=(read,),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        os.close(read)
        time.sleep(1.0)  # its interpreter started and imported before the window

    def start(self) -> None:
        os.write(self.write, b"s")

    def stop(self) -> None:
        os.write(self.write, b"x")
        os.close(self.write)
        self.process.wait(timeout=60)


def _split(ends: list[float], starts: list[float], last: int, after: int, probe: Probe) -> dict:
    """hook = the window-ending call (index ``last``); after = the next ``after`` steps."""
    return {
        "open_s": ends[WAIT] - ends[WAIT - 2],  # the steps around the window's open (its
        # warm-up step's begin: the profiler starts; ours also makes the end's files)
        "hook_s": ends[last] - starts[last],
        "after_s": ends[last + after] - ends[last],
        "after_cpu_s": probe.thread_cpu[1] - probe.thread_cpu[0],
        "worker_cpu_s": probe.worker_cpu_s,
    }


# -- decorator (context manager) -----------------------------------------------------------


def decorator_child(variant: str, ops: int, steps: int, after: int, folder: Path) -> dict:
    import torch

    import neuron_mlflow as nm

    x = torch.ones(8)
    total = WAIT + 1 + steps + after
    last = WAIT + steps  # the step() that ends the window
    starts: list[float] = []
    ends: list[float] = []
    probe = Probe()
    if variant == "ours":
        probe.watch_worker()
        with nm.profile(**our_config(steps, folder)) as prof:
            lead()
            for index in range(total):
                x = work(ops, x)
                starts.append(time.perf_counter())
                prof.step()
                ends.append(time.perf_counter())
                probe.sample(index, last, after)
        summary = prof.summary
        check = summary is not None and summary.steps == steps
    else:
        if variant == "busy":
            probe.busy = Busy()
        prof, path = raw_profiler(steps, folder)
        prof.start()
        lead()
        for index in range(total):
            x = work(ops, x)
            starts.append(time.perf_counter())
            prof.step()
            ends.append(time.perf_counter())
            probe.sample(index, last, after)
        prof.stop()
        check = path.exists()
    return {**_split(ends, starts, last, after, probe), "check": bool(check)}


# -- Lightning ------------------------------------------------------------------------------


def lightning_child(variant: str, ops: int, steps: int, after: int, folder: Path) -> dict:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    import neuron_mlflow as nm

    class OpsModule(LightningModule):
        """``ops`` small aten ops per training step, plus a tiny real loss."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x = work(ops, torch.ones(8))
            return self.layer(batch[0]).pow(2).mean() + 0.0 * x.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class TransformerModule(OpsModule):
        """A small transformer encoder (:data:`TRANSFORMER`): one training step a batch."""

        def __init__(self) -> None:
            super().__init__()
            t = TRANSFORMER
            layer = torch.nn.TransformerEncoderLayer(
                t["d_model"], t["heads"], 4 * t["d_model"], batch_first=True
            )
            self.encoder = torch.nn.TransformerEncoder(layer, t["layers"])

        def training_step(self, batch, batch_idx):
            t = TRANSFORMER
            x = torch.randn(t["batch"], t["sequence"], t["d_model"])
            return self.encoder(x).pow(2).mean() + 0.0 * self.layer(batch[0]).sum()

    class RawProfilerCallback(Callback):
        """What a user writes without neuron-mlflow: step a raw torch.profiler."""

        def __init__(self) -> None:
            self.prof, self.path = raw_profiler(steps, folder)

        def on_train_start(self, trainer, pl_module) -> None:
            self.prof.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.prof.step()

        def on_train_end(self, trainer, pl_module) -> None:
            self.prof.stop()

    class Before(Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 0:
                lead()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.starts.append(time.perf_counter())

    class After(Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.ends.append(time.perf_counter())
            probe.sample(len(self.ends) - 1, last, after)

    total = WAIT + 1 + steps + after
    last = WAIT + steps  # batch index (= global step) whose on_train_batch_end ends it
    probe = Probe()
    if variant == "ours":
        probe.watch_worker()
    if variant == "busy":
        probe.busy = Busy()
    profiler = (
        nm.NeuronProfilerCallback(**our_config(steps, folder))
        if variant == "ours"
        else RawProfilerCallback()
    )
    before, end = Before(), After()
    data = DataLoader(TensorDataset(torch.randn(4 * total, 8)), batch_size=4)
    trainer = Trainer(
        max_steps=total,
        callbacks=[before, profiler, end],
        logger=False,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    torch.manual_seed(0)
    trainer.fit(OpsModule() if ops else TransformerModule(), data)
    if variant == "ours":
        summary = profiler.summaries.get("train")
        check = summary is not None and summary.steps == steps
    else:
        check = profiler.path.exists()
    assert len(end.ends) == total, len(end.ends)
    return {**_split(end.ends, before.starts, last, after, probe), "check": bool(check)}


# -- the parent: fresh processes, interleaved ----------------------------------------------


def wait_for_worker(spool: Path, timeout_s: float = 120.0) -> None:
    """Until no worker process holds the spool's worker lock (it exits after its queue)."""
    lock = spool / ".worker.lock"
    deadline = time.monotonic() + timeout_s
    while lock.exists() and time.monotonic() < deadline:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            time.sleep(0.1)
        finally:
            os.close(fd)


def run_child(mode: str, variant: str, size: str, after: int, base: Path) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"{mode}-{variant}-{size}-", dir=base))
    ops, steps = SIZES[size]
    after = after_steps(size, after)
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, variant, str(ops), str(steps),
         str(after), str(folder)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"{mode} {variant} {size} failed:\n{out.stderr[-3000:]}")
    wait_for_worker(folder / "spool")
    return json.loads(out.stdout.strip().splitlines()[-1])


def init_store(base: Path) -> None:
    """Create the SQLite store and the experiment once (not inside a measured process)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(EXPERIMENT)


def after_steps(size: str, after: int) -> int:
    """The steps timed after the window: at most 5 for the transformer (its steps are long)."""
    return min(after, 5) if SIZES[size][0] == 0 else after


def sizes_of(mode: str, sizes: list[str]) -> list[str]:
    """The sizes a front end runs: the transformer in Lightning only."""
    return [s for s in sizes if mode == "lightning" or SIZES[s][0] > 0]


def med(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["both", "decorator", "lightning"], default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--after", type=int, default=20, help="steps timed after the window")
    parser.add_argument(
        "--sizes", default="small,large,transformer",
        help="window sizes (the transformer size runs in Lightning only)",
    )  # fmt: skip
    parser.add_argument(
        "--busy", choices=["cpu", "disk", "write", "memory", "import"], default="cpu",
        help="the control's work: parse JSON (cpu), commit to SQLite as MLflow's local store "
        "does (disk), gzip a large trace into a new file and remove it (write), touch "
        "fresh memory and give it back (memory), or import what our worker imports first, "
        "once (import)",
    )  # fmt: skip
    parser.add_argument(
        "--lead-s", type=float, default=0.0,
        help="sleep this long before the first step (every variant): our worker's one-time "
        "imports are then done before the window (a diagnostic)",
    )  # fmt: skip
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, variant, ops, steps, after, folder = args.child
        child = decorator_child if mode == "decorator" else lightning_child
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = child(variant, int(ops), int(steps), int(after), Path(folder))
        print(json.dumps(result))
        return
    os.environ[BUSY_ENV] = args.busy
    os.environ[LEAD_ENV] = str(args.lead_s)  # read by the control's children
    base = Path(tempfile.mkdtemp(prefix="window-end-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{base / 'mlflow.db'}"
    init_store(base)
    modes = ["decorator", "lightning"] if args.mode == "both" else [args.mode]
    sizes = args.sizes.split(",")
    results: dict[tuple[str, str, str], list[dict]] = {}
    started = time.monotonic()
    for round_index in range(args.rounds):
        for mode in modes:
            for size in sizes_of(mode, sizes):
                order = VARIANTS[round_index % 3 :] + VARIANTS[: round_index % 3]
                for variant in order:
                    result = run_child(mode, variant, size, args.after, base)
                    if not result["check"]:
                        sys.exit(f"{mode} {variant} {size}: the window was not logged")
                    results.setdefault((mode, size, variant), []).append(result)
        print(f"round {round_index + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s)",
              file=sys.stderr)  # fmt: skip
    import lightning
    import torch

    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}, {args.rounds} rounds "
        f"(a fresh process per measurement), {os.cpu_count()} CPUs, medians"
    )
    print()
    print(
        f"| front end | window | hook ours ms | hook raw ms | hook ratio | steps after "
        f"({args.after}; transformer {after_steps('transformer', args.after)}), ours ms | "
        "raw ms | after ratio | raw + a busy process ms | its ratio | "
        "training thread CPU after, ours/raw | worker CPU by then ms | window's opening "
        "steps, ours/raw |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        for size in sizes_of(mode, sizes):
            ops, steps = SIZES[size]
            ours, raw = results[(mode, size, "ours")], results[(mode, size, "raw")]
            busy = results[(mode, size, "busy")]

            def both(key: str, ours=ours, raw=raw) -> tuple[float, float]:
                return med([r[key] for r in ours]), med([r[key] for r in raw])

            hook_o, hook_r = both("hook_s")
            aft_o, aft_r = both("after_s")
            cpu_o, cpu_r = both("after_cpu_s")
            open_o, open_r = both("open_s")
            aft_b = med([r["after_s"] for r in busy])
            worker = med([r["worker_cpu_s"] for r in ours])
            shape = (
                f"{ops} ops x {steps} steps" if ops else
                "{layers} layers, d={d_model}, seq {sequence}, batch {batch}".format(**TRANSFORMER)
                + f", {steps} steps"
            )  # fmt: skip
            print(
                f"| {mode} | {size} ({shape}) | {1e3 * hook_o:.1f} | "
                f"{1e3 * hook_r:.1f} | {hook_o / hook_r:.2f} | {1e3 * aft_o:.1f} | "
                f"{1e3 * aft_r:.1f} | {aft_o / aft_r:.2f} | {1e3 * aft_b:.1f} | "
                f"{aft_b / aft_r:.2f} | {cpu_o / cpu_r:.2f} | {1e3 * worker:.0f} | "
                f"{open_o / open_r:.2f} |"
            )
    print()
    print("per round (hook ms / after ms):", file=sys.stderr)
    for key, values in results.items():
        print(key, [f"{1e3 * r['hook_s']:.1f}/{1e3 * r['after_s']:.1f}" for r in values],
              file=sys.stderr)  # fmt: skip
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
