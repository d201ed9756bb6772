"""The timeline of a trace: lanes, nesting, self time, device links, steps, the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_mlflow.errors import TraceFormatError
from neuron_mlflow.trace.summarize import summarize_trace
from neuron_mlflow.trace.timeline import build_timeline

TRACES = sorted((Path(__file__).resolve().parents[1] / "data" / "traces").glob("*.json.gz"))


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        _x("user_annotation", "ProfilerStep#4", 1000, 100),
        _x(
            "cpu_op",
            "aten::linear",
            1000,
            50,
            **{"Input Dims": [[8, 4], [4, 4]], "Input type": ["float", "float"]},
        ),
        _x("cpu_op", "aten::mm", 1010, 30),
        _x("cuda_runtime", "cudaLaunchKernel", 1020, 5, correlation=11),
        _x("cpu_op", "aten::add", 1060, 10),
        _x("user_annotation", "ProfilerStep#5", 1100, 100),
        _x("cpu_op", "aten::mm", 1110, 20),
        _x("cuda_runtime", "cudaLaunchKernel", 1115, 5, correlation=12),
        _x("kernel", "gemm", 1030, 40, tid=7, pid=0, correlation=11),
        _x("kernel", "gemm", 1150, 10, tid=7, pid=0, correlation=12),
        _x("cpu_op", "aten::relu", 1500, 1, tid=2),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _bars(timeline) -> list[dict]:
    ev = timeline.events
    return [
        {key: ev[key][i] for key in ev} | {"name": timeline.names[ev["name"][i]]}
        for i in range(len(ev["dur_us"]))
    ]


def test_lanes_nesting_self_time_shapes_and_device_links(trace: Path) -> None:
    t = build_timeline(trace)
    assert [lane["name"] for lane in t.lanes] == ["CPU main", "CPU thread 2", "GPU 0 stream 7"]
    assert t.origin_us == 1000 and t.span_us == 501 and t.total_events == 7 and t.left_out == 0
    bars = _bars(t)
    assert [b["dur_us"] for b in bars] == sorted((b["dur_us"] for b in bars), reverse=True)
    linear = next(b for b in bars if b["name"] == "aten::linear")
    first_mm = next(b for b in bars if b["name"] == "aten::mm" and b["start_us"] == 10)
    assert (linear["depth"], linear["self_us"], first_mm["depth"]) == (0, 20.0, 1)
    assert bars[first_mm["parent"]]["name"] == "aten::linear"
    assert t.shapes[linear["shape"]] == "float[8, 4], float[4, 4]"
    kernels = [b for b in bars if b["kind"] == 1]
    assert [t.names[k["launcher"]] for k in kernels] == ["aten::mm", "aten::mm"]
    assert bars[kernels[0]["parent"]] == first_mm and all(k["lane"] == 2 for k in kernels)


def test_steps_wall_device_time_and_busy_share(trace: Path) -> None:
    steps = build_timeline(trace).steps
    assert [(s["step"], s["start_us"], s["wall_us"], s["device_us"]) for s in steps] == [
        (4, 0, 100, 40),
        (5, 100, 100, 10),
    ]
    assert [s["device_busy_pct"] for s in steps] == [40.0, 10.0]


def test_budget_keeps_the_longest_and_counts_the_rest(trace: Path) -> None:
    t = build_timeline(trace, max_events=3)
    assert [t.names[i] for i in t.events["name"]] == ["aten::linear", "gemm", "aten::mm"]
    assert t.left_out == 4 and t.total_events == 7
    assert all(p < 3 for p in t.events["parent"])


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.split(".")[0])
def test_real_traces_agree_with_the_summary(path: Path) -> None:
    t = build_timeline(path)
    result = summarize_trace(path)
    kinds, parents = t.events["kind"], t.events["parent"]
    assert sum(kinds) == result.device_events
    linked = sum(1 for k, p in zip(kinds, parents, strict=True) if k == 1 and p >= 0)
    assert linked == result.device_events - result.unattributed_device_events
    self_cpu = sum(s for k, s in zip(kinds, t.events["self_us"], strict=True) if k == 0)
    steps = max(result.summary.steps, 1)
    assert self_cpu == pytest.approx(result.summary.cpu_time_us * steps, rel=1e-6)
    assert len(t.steps) == (result.summary.steps if t.steps else 0)


def test_truncated_trace_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(TraceFormatError, match="byte offset"):
        build_timeline(path)


def test_a_thread_with_runtime_calls_only_gets_no_lane(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    events = [
        _x("cpu_op", "aten::mm", 0, 10),
        _x("cuda_runtime", "cudaMemcpyAsync", 2, 1, tid=9, correlation=3),
        _x("gpu_memcpy", "Memcpy HtoD", 5, 2, tid=7, pid=0, correlation=3),
    ]
    path.write_text(json.dumps(events))
    t = build_timeline(path)
    assert [lane["name"] for lane in t.lanes] == ["CPU thread 1", "CUDA 0 stream 7"]
    assert sorted(t.events["lane"]) == [0, 1]
