"""Reading a live torch.profiler window: op rows and top-level dispatches."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from neuron_mlflow.capture.profile_reader import CALL_MARKER_PREFIX, read_profile
from tests.helpers import inputs, rmsnorm_fused, rmsnorm_naive


def _profile(fn, marked: bool, steps: int = 3):
    x, w = inputs()
    fn(x, w)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            _ = torch.zeros(2)  # work between calls
            if marked:
                with record_function(CALL_MARKER_PREFIX + fn.__name__):
                    fn(x, w)
            else:
                fn(x, w)
    return prof


def test_naive_rmsnorm_is_six_dispatches_and_fused_is_one() -> None:
    naive = read_profile(_profile(rmsnorm_naive, marked=True), calls_marked=True)
    fused = read_profile(_profile(rmsnorm_fused, marked=True), calls_marked=True)
    assert naive.top_level_calls == 6 * 3
    assert fused.top_level_calls == 1 * 3
    assert {op.name for op in fused.cpu_ops} >= {"aten::rms_norm", "aten::_fused_rms_norm"}


def test_marked_calls_leave_out_work_between_calls() -> None:
    marked = read_profile(_profile(rmsnorm_naive, marked=True), calls_marked=True)
    unmarked = read_profile(_profile(rmsnorm_naive, marked=False))
    assert "aten::zeros" not in {op.name for op in marked.cpu_ops}
    assert "aten::zeros" in {op.name for op in unmarked.cpu_ops}
    assert unmarked.top_level_calls == 7 * 3


def test_marked_aggregation_agrees_with_key_averages() -> None:
    x, w = inputs()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function(CALL_MARKER_PREFIX + "naive"):
                rmsnorm_naive(x, w)
    ours = {op.name: op for op in read_profile(prof, calls_marked=True).cpu_ops}
    theirs = {
        row.key: row for row in prof.key_averages() if not row.key.startswith(CALL_MARKER_PREFIX)
    }
    assert set(ours) == set(theirs)
    for name, op in ours.items():
        assert op.count == theirs[name].count
        assert abs(op.self_cpu_us - theirs[name].self_cpu_time_total) < 1e-6
        assert abs(op.cpu_total_us - theirs[name].cpu_time_total) < 1e-6


def test_profiler_step_markers_are_excluded() -> None:
    x, w = inputs()
    seen = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
        on_trace_ready=lambda p: seen.append(read_profile(p)),
    ) as prof:
        for _ in range(3):
            rmsnorm_fused(x, w)
            prof.step()
    (stats,) = seen
    names = {op.name for op in stats.cpu_ops}
    assert "aten::rms_norm" in names
    assert not any(name.startswith("ProfilerStep") for name in names)
    assert stats.top_level_calls == 2
