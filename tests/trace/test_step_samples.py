"""steps.jsonl: per-step samples of a real profiled window, read back from MLflow."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.summary.statistics import iqr, median
from neuron_mlflow.trace.step_samples import read_step_samples, write_step_samples


def test_every_window_keeps_its_steps_and_they_add_up_to_its_metrics(tracking_uri) -> None:
    mlflow.set_tracking_uri(tracking_uri)
    a = torch.randn(32, 32)

    def work() -> torch.Tensor:
        for _ in range(3):
            torch.mm(a, a)
        return (a * 2).sum()

    with mlflow.start_run() as run:
        schedule = nm.Schedule(warmup=1, active=6, repeat=2)
        profiled = nm.profile(schedule=schedule, backend="cpu", local_dir=tempfile.mkdtemp())(work)
        for _ in range(14):
            profiled()
        profiled.profiler.session.wait(60)
    client = MlflowClient()
    windows = sorted(x.path for x in client.list_artifacts(run.info.run_id, "profile") if x.is_dir)
    assert len(windows) == 2  # a run keeps every window
    history = {
        m.step: m.value for m in client.get_metric_history(run.info.run_id, "profile/cpu_time_us")
    }
    p50 = {
        m.step: m.value
        for m in client.get_metric_history(run.info.run_id, "profile/cpu_time_us_p50")
    }
    wall_iqr = client.get_run(run.info.run_id).data.metrics["profile/wall_time_us_iqr"]
    for window in windows:
        local = Path(
            client.download_artifacts(run.info.run_id, f"{window}/steps.jsonl", tempfile.mkdtemp())
        )
        heads, ops = read_step_samples(local.read_text())
        assert [h["step"] for h in heads] == list(range(6))
        last = int(window.rsplit("-", 1)[1])
        cpu = [h["cpu_time_us"] for h in heads]
        assert sum(cpu) / 6 == pytest.approx(history[last], rel=1e-3)  # the window's mean
        assert p50[last] == pytest.approx(median(cpu), abs=1e-3)
        mm = [row for row in ops if row["op"] == "aten::mm"]
        assert len(mm) == 6 and all(row["calls"] == 3 for row in mm)
        assert all(row["key"] == row["op"] for row in ops)
    assert wall_iqr == pytest.approx(iqr([h["wall_time_us"] for h in heads]), abs=1e-3)
    mlflow.set_tracking_uri(None)


def test_compiled_graphs_get_a_stable_key(tmp_path: Path) -> None:
    events = []
    for step, graph_hash in enumerate(("fepdjo2lv4abcdefghijklmnop", "fepdjo2lv4abcdefghijklmnop")):
        t = 1000 * step
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "neuron_mlflow: f",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 500,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"Call_CompiledFxGraph_{graph_hash}",
                "pid": 1,
                "tid": 1,
                "ts": t + 1,
                "dur": 100,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": t + 200,
                "dur": 10,
            },
        ]
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.json").write_text(json.dumps({"traceEvents": events}))
    write_step_samples(tmp_path, tmp_path / "traces", top_k=5)
    _, ops = read_step_samples((tmp_path / "steps.jsonl").read_text())
    keys = {row["op"]: row["key"] for row in ops}
    assert keys["Call_CompiledFxGraph_fepdjo2lv4abcdefghijklmnop"] == "Call_CompiledFxGraph_#0"
    assert keys["aten::mm"] == "aten::mm"


def test_a_window_without_a_trace_writes_nothing(tmp_path: Path) -> None:
    assert write_step_samples(tmp_path, tmp_path / "traces", top_k=5) == {}
    assert not (tmp_path / "steps.jsonl").exists()
