"""Load test: two 4-rank DDP jobs log into one PostgreSQL-backed ``mlflow server`` at once.

A real PostgreSQL cluster (``initdb``/``pg_ctl`` in a temp folder, :mod:`tests.sinks.postgres`)
backs a real ``mlflow server`` with a local artifact root. Two jobs of 4 CPU ranks each
(``torchrun``, Lightning DDP on gloo, ``tests/load_job.py``) run at the same time, each logging
3 windows of 500 distinct operators into its own run of one experiment. Read back through
``MlflowClient``: every window of every rank landed (each rank's trace, holding its 500
operators, and its per-rank times; rank 0's summary with every operator as metrics), every
metric holds each window's value exactly once (also checked in the database itself), and no
window is left pending in either job's spool. The wall time of the two jobs and the MLflow
requests per window (server access log) are printed and written to
``$LOAD_NUMBERS_FILE`` when set.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.sinks.spool import Spool
from tests.conftest import running_mlflow_server
from tests.helpers import ROOT
from tests.load_job import OPS, RANKS, WINDOWS
from tests.sinks.postgres import postgres_cluster

JOBS = ("job-a", "job-b")
EXPERIMENT = "postgres-load"
P = "profile/train"
# Schedule(warmup=1, active=1, repeat=3): windows record train steps 1, 3, 5, logged at
# global_step 2, 4, 6 (the step Lightning logs that batch's loss at).
FOLDERS = [f"{P}/step_{s:06d}-{s:06d}" for s in (1, 3, 5)]
METRIC_STEPS = [2, 4, 6]
LOAD_OPS = {f"load_op_{i:03d}" for i in range(OPS)}
JOB_TIMEOUT_S = 900
ACCESS = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')


def _job_env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(
        MLFLOW_TRACKING_URI=uri,
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _run_jobs(uri: str, tmp: Path) -> tuple[dict[str, str], dict[str, float], float]:
    """Start both jobs at once; wait for both. Return run ids, each job's and the total wall."""
    procs: dict[str, subprocess.Popen] = {}
    started = time.monotonic()
    for name in JOBS:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(RANKS), str(ROOT / "tests" / "load_job.py"),
            uri, EXPERIMENT, name, str(tmp / f"spool-{name}"),
        ]  # fmt: skip
        procs[name] = subprocess.Popen(
            command,
            stdout=(tmp / f"{name}.out").open("w"),
            stderr=(tmp / f"{name}.err").open("w"),
            env=_job_env(uri),
            cwd=tmp,
            start_new_session=True,  # its own process group: torchrun and its 4 ranks
        )
    walls: dict[str, float] = {}
    try:
        while len(walls) < len(procs):
            for name, proc in procs.items():
                if name not in walls and proc.poll() is not None:
                    walls[name] = time.monotonic() - started
            if time.monotonic() - started > JOB_TIMEOUT_S:
                pytest.fail(
                    f"jobs still running after {JOB_TIMEOUT_S} s: {set(procs) - set(walls)}"
                )
            time.sleep(0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    total = time.monotonic() - started
    run_ids = {}
    for name, proc in procs.items():
        err = (tmp / f"{name}.err").read_text()
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{err[-6000:]}"
        out = (tmp / f"{name}.out").read_text()
        (run_ids[name],) = [line[7:] for line in out.splitlines() if line.startswith("RUN_ID=")]
    return run_ids, walls, total


def _requests(log: Path) -> collections.Counter:
    """Responses in the server's access log by ``(method, endpoint, status)``; artifact
    paths after the endpoint's fixed part are dropped."""
    counts: collections.Counter = collections.Counter()
    for method, path, status in ACCESS.findall(log.read_text(errors="replace")):
        path = path.split("?")[0]
        if "/mlflow-artifacts/artifacts/" in path:
            path = path.split("/mlflow-artifacts/artifacts/")[0] + "/mlflow-artifacts/artifacts/…"
        counts[(method, path, status)] += 1
    return counts


def _files(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out: list[str] = []
    for info in client.list_artifacts(run_id, path):
        out.extend(_files(client, run_id, info.path) if info.is_dir else [info.path])
    return out


def _trace_ops(client: MlflowClient, run_id: str, path: str, dest: Path) -> collections.Counter:
    """How often each ``load_op_*`` range occurs in one uploaded trace (downloaded)."""
    local = client.download_artifacts(run_id, path, str(dest))
    with gzip.open(local, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    return collections.Counter(
        e["name"] for e in events if str(e.get("name", "")).startswith("load_op_")
    )


def _check_run(client: MlflowClient, run_id: str, dest: Path) -> int:
    """Assert every window of every rank of one job's run landed, each value once; return
    the number of metric keys checked."""
    run = client.get_run(run_id)
    assert run.data.tags["neuron_mlflow.world_size"] == str(RANKS)
    files = _files(client, run_id)
    for folder in FOLDERS:
        for name in ("summary.md", "summary.json", "ops.csv", "op_keys.json", "report.html"):
            assert f"{folder}/{name}" in files, (run_id, folder, name)
        for rank in range(RANKS):
            traces = [f for f in files if f.startswith(f"{folder}/traces/rank_{rank}/")]
            assert len(traces) == 1 and traces[0].endswith(".pt.trace.json.gz"), (folder, traces)
            ops = _trace_ops(client, run_id, traces[0], dest / run_id / folder / str(rank))
            assert set(ops) == LOAD_OPS and set(ops.values()) == {1}, (folder, rank, len(ops))
    assert len([f for f in files if "/traces/" in f]) == WINDOWS * RANKS, "no stray traces"

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    keys = sorted(run.data.metrics)
    with ThreadPoolExecutor(4) as pool:
        histories = dict(zip(keys, pool.map(history, keys), strict=True))
    for key, history in histories.items():
        steps = [step for step, _ in history]
        assert len(steps) == len(set(steps)), f"{key}: a window's value logged twice: {history}"
        assert set(steps) <= set(METRIC_STEPS), (key, history)
    # every window, every rank: the root's summary and each rank's times, exactly once each
    every_window = [f"{P}/{m}" for m in ("steps", "op_calls", "cpu_time_us", "wall_time_us")]
    for rank in range(RANKS):
        every_window += [f"{P}/rank/{rank}/cpu_time_us", f"{P}/rank/{rank}/wall_time_us"]
    for key in every_window:
        assert sorted(s for s, _ in histories[key]) == METRIC_STEPS, (key, histories[key])
        assert all(v > 0 for _, v in histories[key]), (key, histories[key])
    assert histories[f"{P}/steps"] == [(s, 1.0) for s in METRIC_STEPS]
    for op in LOAD_OPS:  # all 500 operators of each window became metrics, once per window
        assert sorted(histories[f"{P}/op/{op}/calls"]) == [(s, 1.0) for s in METRIC_STEPS], op
        assert sorted(s for s, _ in histories[f"{P}/op/{op}/self_cpu_us"]) == METRIC_STEPS, op
    return len(keys)


def _database_duplicates(pg_uri: str) -> tuple[int, int, list[tuple]]:
    """From PostgreSQL itself: runs, metric rows, and any (run, key, step) stored twice."""
    import psycopg2

    dsn = pg_uri.replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM runs")
        (runs,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM metrics")
        (rows,) = cursor.fetchone()
        cursor.execute(
            "SELECT run_uuid, key, step, count(*) FROM metrics "
            "GROUP BY run_uuid, key, step HAVING count(*) > 1 LIMIT 20"
        )
        duplicates = cursor.fetchall()
    conn.close()
    return runs, rows, duplicates


@pytest.mark.slow
def test_two_ddp_jobs_log_into_postgres_at_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # 24 downloads
    with postgres_cluster() as pg_uri, running_mlflow_server(tmp_path, pg_uri) as uri:
        client = MlflowClient(uri)
        experiment_id = client.create_experiment(EXPERIMENT)
        log = tmp_path / "server.log"
        before = _requests(log)
        run_ids, walls, total = _run_jobs(uri, tmp_path)
        during = _requests(log) - before  # the jobs' requests only, before any read-back

        runs = client.search_runs([experiment_id])
        assert sorted((r.info.run_name, r.info.run_id) for r in runs) == sorted(
            (name, run_ids[name]) for name in JOBS
        ), "one run per job, nothing else"
        checked = {name: _check_run(client, run_ids[name], tmp_path / "dl") for name in JOBS}
        db_runs, db_rows, duplicates = _database_duplicates(pg_uri)
    assert db_runs == len(JOBS), "the runs are in PostgreSQL"
    assert duplicates == [], f"metric values stored twice: {duplicates}"
    for name in JOBS:
        records = list(Spool(tmp_path / f"spool-{name}").windows())
        windows = [r for r in records if r.path.name != "ranks"]
        assert len(windows) == WINDOWS * RANKS, (name, [str(r.path) for r in records])
        assert {r.status for r in records} == {"done"}, [
            (str(r.path), r.status) for r in records if r.status != "done"
        ]

    ok = sum(n for (_, _, status), n in during.items() if status.startswith("2"))
    failed = {k: n for k, n in during.items() if not k[2].startswith("2")}
    windows = len(JOBS) * WINDOWS
    lines = [
        "## PostgreSQL load test (tests/sinks/test_postgres_load.py)",
        "",
        f"{len(JOBS)} jobs x {RANKS} CPU ranks (torchrun, Lightning DDP, gloo) at once, "
        f"{WINDOWS} windows x {OPS} operators each; {os.cpu_count()} CPU cores",
        "",
        f"- wall time, both jobs (start to the last exit): {total:.1f} s "
        f"({', '.join(f'{n} {w:.1f} s' for n, w in walls.items())})",
        f"- successful requests while the jobs ran: {ok}; per window of a {RANKS}-rank job: "
        f"{ok / windows:.1f}; per rank-window: {ok / (windows * RANKS):.1f}",
        f"- non-2xx responses: {sum(failed.values())} {failed or ''}",
        f"- metric keys per run checked for duplicates: {checked}; metric rows in PostgreSQL: "
        f"{db_rows}",
        "",
        "| request | count |",
        "|---|---:|",
        *(f"| {m} {p} ({s}) | {n} |" for (m, p, s), n in during.most_common()),
    ]
    report = "\n".join(lines)
    print("\n" + report)
    if os.environ.get("LOAD_NUMBERS_FILE"):
        Path(os.environ["LOAD_NUMBERS_FILE"]).write_text(report + "\n")
