"""`neuron-mlflow sync` killed (SIGKILL) at random points, then run again: every value once."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.sinks.spool import Spool
from tests.helpers import ROOT
from tests.sinks.test_delivery import spooled_window

WINDOWS = 2
METRICS = 2300  # three log_batch chunks per window


def _sync(spool: Path, db: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{db}", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "neuron_mlflow.cli", "sync", "--local-dir", str(spool)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _fill(spool_dir: Path) -> dict[str, int]:
    """The spool of one session; returns each window's capture time by metric step."""
    spool = Spool(spool_dir)
    session = spool.new_session_dir()
    captured = {}
    for window in range(WINDOWS):
        record = spooled_window(spool, session, 10 * window, n_metrics=METRICS)
        for i in range(4):
            (record.artifacts_dir / f"extra_{i}.txt").write_text("x" * 1000)
        captured[record.manifest["metric_step"]] = record.manifest["captured_ms"]
    return captured


def _progress(spool: Path) -> tuple[int, int]:
    """(windows done, metric chunks and files confirmed) in the spool's manifests."""
    records = list(Spool(spool).windows())
    done = sum(r.status == "done" for r in records)
    parts = sum(
        len(p.get("metric_chunks", [])) + len(p.get("artifact_files", []))
        for p in (r.manifest.get("progress", {}) for r in records)
    )
    return done, parts


def _kill_after(proc: subprocess.Popen, spool: Path, parts: int, extra_s: float) -> None:
    """SIGKILL ``proc`` ``extra_s`` after the spool shows ``parts`` confirmed parts."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and _progress(spool)[1] < parts and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(extra_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_sync_killed_at_random_points_sends_each_metric_value_exactly_once(tmp_path) -> None:
    template = tmp_path / "template"
    captured = _fill(template)
    store = tmp_path / "store.db"
    MlflowClient(f"sqlite:///{store}").search_experiments()  # creates the store's tables
    total = WINDOWS * (3 + 7)  # per window: 3 metric chunks, 7 files

    rng = random.Random(13)
    cut_midway = 0
    for trial in range(10):
        spool, db = tmp_path / f"spool{trial}", tmp_path / f"mlflow{trial}.db"
        shutil.copytree(template, spool)
        shutil.copy(store, db)
        # a random point: after 0..total-1 confirmed parts, plus up to 50 ms
        _kill_after(_sync(spool, db), spool, rng.randrange(total), rng.uniform(0, 0.05))
        done, _ = _progress(spool)
        cut_midway += done < WINDOWS
        assert _sync(spool, db).wait(300) == 0
        assert {r.status for r in Spool(spool).windows()} == {"done"}

        with sqlite3.connect(db) as conn:
            (runs,) = conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            rows = conn.execute(
                "SELECT key, step, timestamp, COUNT(*) FROM metrics GROUP BY key, step"
            ).fetchall()
        assert runs == 1, f"trial {trial}: the session's windows went into one run"
        assert len(rows) == WINDOWS * METRICS, f"trial {trial}: every value arrived"
        twice = [row for row in rows if row[-1] != 1]
        assert not twice, f"trial {trial}: values stored twice: {twice[:3]}"
        assert all(ts == captured[step] for _, step, ts, _ in rows), "capture-time timestamps"
    assert cut_midway >= 8, f"only {cut_midway} of 10 kills fell inside the upload"
