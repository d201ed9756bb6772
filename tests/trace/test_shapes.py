"""What else the trace holds: input shapes per op row, FLOPs (torch's own estimates, from the
shapes) and peak allocated memory, in the summary, its files and the window's metrics."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from torch.profiler import ProfilerActivity, profile, record_function

import neuron_mlflow as nm
from neuron_mlflow.naming import call_marker
from neuron_mlflow.trace.summarize import summarize_trace
from tests.helpers import metrics


def flop_heavy() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 16, 16), torch.randn(4, 3, 3, 3)
    a, b = torch.randn(2, 5, 6), torch.randn(2, 6, 7)
    torch.nn.functional.conv2d(x, w, stride=2, padding=1)
    torch.bmm(a, b)
    torch.addmm(torch.randn(5, 7), a[0], b[0])
    torch.baddbmm(torch.randn(2, 5, 7), a, b)
    torch.mm(a[1], b[1])
    _ = x * 2
    _ = x.add(1)
    _ = x.mul(x)


def test_flops_from_the_trace_equal_torchs_own(tmp_path) -> None:
    with (
        profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof,
        record_function(call_marker("f")),
    ):
        flop_heavy()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    theirs = {row.key: row.flops for row in prof.key_averages() if row.flops}
    assert len(theirs) == 7
    summary = summarize_trace(tmp_path / "t.json").summary
    ours = {op.name: op.flops for op in summary.ops if op.flops}
    assert ours == theirs
    assert summary.flops_per_step == sum(theirs.values())


def test_shapes_flops_and_memory_reach_the_window(tmp_path, tracking_uri) -> None:
    @nm.profile(
        backend="cpu",
        schedule=nm.Schedule(warmup=1, active=2),
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        top_k=100,
    )
    def step() -> None:
        keep = torch.ones(1024, 256)  # 1 MiB alive at the peak
        flop_heavy()
        del keep

    for _ in range(3):
        step()
    run_id = step.profiler.run_id
    got = metrics(run_id)
    assert got["profile/memory/cpu/peak_allocated_bytes"] >= 2**20
    assert (
        got["profile/memory/peak_allocated_bytes"] == got["profile/memory/cpu/peak_allocated_bytes"]
    )
    assert got["profile/op/aten.conv2d/flops"] == 27648  # 2 x N x Ho x Wo x k x k x Cin x Cout
    assert got["profile/op/aten.mm/flops"] == 2 * 5 * 6 * 7
    assert got["profile/flops_per_step"] == pytest.approx(
        sum(v for k, v in got.items() if k.endswith("/flops") and k.startswith("profile/op/"))
    )
    assert got["profile/achieved_tflops"] == pytest.approx(
        got["profile/flops_per_step"] / got["profile/wall_time_us"] / 1e6
    )
    folder = "profile/step_000001-000002"
    local = Path(MlflowClient().download_artifacts(run_id, folder, str(tmp_path / "dl")))
    table = (local / "summary.md").read_text()
    assert "| Input shapes | FLOPs |" in table
    assert "[[2, 3, 16, 16], [4, 3, 3, 3], [], [], [], [], []]" in table
    assert "Peak allocated memory (cpu)" in table
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO((local / "ops.csv").read_text()))}
    assert rows["aten::mm"]["input_shapes"] == "[[5, 6], [6, 7]]"
    assert float(rows["aten::mm"]["flops"]) == 2 * 5 * 6 * 7
