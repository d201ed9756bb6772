"""Reading a live window from its own exported trace: op rows and top-level dispatches, the
same as torch's own tables where those are right, with the counting rules where they are not."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from neuron_mlflow.capture.profile_reader import CALL_MARKER_PREFIX, read_window_trace
from tests.helpers import inputs, rmsnorm_fused, rmsnorm_naive


def _profile(tmp_path: Path, fn, marked: bool, steps: int = 3):
    x, w = inputs()
    fn(x, w)
    folder = tmp_path / f"{fn.__name__}_{marked}"
    folder.mkdir()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            _ = torch.zeros(2)  # work between calls
            if marked:
                with record_function(CALL_MARKER_PREFIX + fn.__name__):
                    fn(x, w)
            else:
                fn(x, w)
    prof.export_chrome_trace(str(folder / "w.pt.trace.json"))
    return prof, read_window_trace(folder, None).summary


def test_naive_rmsnorm_is_six_dispatches_and_fused_is_one(tmp_path) -> None:
    _, naive = _profile(tmp_path, rmsnorm_naive, marked=True)
    _, fused = _profile(tmp_path, rmsnorm_fused, marked=True)
    assert naive.steps == fused.steps == 3  # one step per marked call
    assert naive.op_calls == 6
    assert fused.op_calls == 1
    assert {op.name for op in fused.ops} >= {"aten::rms_norm", "aten::_fused_rms_norm"}


def test_marked_calls_leave_out_work_between_calls(tmp_path) -> None:
    _, marked = _profile(tmp_path, rmsnorm_naive, marked=True)
    _, unmarked = _profile(tmp_path, rmsnorm_naive, marked=False)
    assert "aten::zeros" not in {op.name for op in marked.ops}
    assert not any(op.name.startswith(CALL_MARKER_PREFIX) for op in marked.ops)
    assert "aten::zeros" in {op.name for op in unmarked.ops}
    assert unmarked.op_calls == 7 * 3  # no step markers: the whole capture is one step


def test_marked_rows_agree_with_key_averages(tmp_path) -> None:
    x, w = inputs()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function(CALL_MARKER_PREFIX + "naive"):
                rmsnorm_naive(x, w)
    prof.export_chrome_trace(str(tmp_path / "w.pt.trace.json"))
    summary = read_window_trace(tmp_path, None).summary
    ours = {op.name: op for op in summary.ops}
    theirs = {
        row.key: row for row in prof.key_averages() if not row.key.startswith(CALL_MARKER_PREFIX)
    }
    assert set(ours) == set(theirs)
    for name, op in ours.items():
        assert op.calls * 3 == theirs[name].count
        assert abs(op.self_cpu_us * 3 - theirs[name].self_cpu_time_total) < 0.01
        assert abs(op.cpu_total_us * 3 - theirs[name].cpu_time_total) < 0.01


def test_profiler_step_markers_are_excluded(tmp_path) -> None:
    x, w = inputs()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
        on_trace_ready=lambda p: p.export_chrome_trace(str(tmp_path / "w.pt.trace.json")),
    ) as prof:
        for _ in range(3):
            rmsnorm_fused(x, w)
            prof.step()
    summary = read_window_trace(tmp_path, None).summary
    names = {op.name for op in summary.ops}
    assert "aten::rms_norm" in names
    assert not any(name.startswith("ProfilerStep") for name in names)
    assert summary.steps == 2 and summary.op_calls == 1


def test_a_folder_without_a_trace_gives_an_empty_summary(tmp_path) -> None:
    stats = read_window_trace(tmp_path / "missing", "CUDA")
    assert stats.summary is not None and stats.summary.ops == ()
    assert stats.summary.device_time_us is None and stats.summary.device_note
