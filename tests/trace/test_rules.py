"""The counting rules (neuron_mlflow/trace/rules.py) on real CUDA/ROCm traces wrapped with the
markers that the decorator and the Lightning callback write, and on small made-up traces."""

from __future__ import annotations

import gzip
import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from neuron_mlflow.naming import TRAIN_STEP_MARKER, call_marker
from neuron_mlflow.trace.summarize import TraceResult, summarize_trace
from tests.helpers import ROOT
from tests.trace.test_streaming import (
    FALLBACK,
    assert_same,
    buffered,
    cpu_first,
    device_first,
    runtime_first,
)

TRACES = ROOT / "tests" / "data" / "traces"
DEVICE_TRACES = [
    TRACES / f"{name}.json.gz"
    for name in (
        "cuda_alexnet_benchmark",
        "cuda_cupti_counters",
        "cuda_sampled_rank0",
        "rocm_mi250_minitoy_train",
    )
]
OPS = ("cpu_op", "user_annotation")
RUNTIME = ("cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_profiler_range")


def _is_op(event: dict) -> bool:
    return (
        event.get("ph") == "X"
        and event.get("cat") in OPS
        and not str(event.get("name", "")).startswith("ProfilerStep")
    )


def _roots(ops: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Each root operator of one thread with its whole call tree (starts in order)."""
    trees: list[tuple[dict, list[dict]]] = []
    end = -1.0
    for op in sorted(ops, key=lambda e: (e["ts"], -e.get("dur", 0))):
        if op["ts"] >= end:
            trees.append((op, []))
            end = op["ts"] + op.get("dur", 0)
        trees[-1][1].append(op)
    return trees


def _folded(ops: list[dict]) -> set[int]:
    """Operators torch's tables fold into their parent: an only child of the same name."""
    parent: dict[int, dict] = {}
    children: Counter = Counter()
    for key in {(e["pid"], e["tid"]) for e in ops}:
        stack: list[dict] = []
        for op in sorted(
            (e for e in ops if (e["pid"], e["tid"]) == key), key=lambda e: (e["ts"], -e["dur"])
        ):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= op["ts"]:
                stack.pop()
            if stack:
                parent[id(op)] = stack[-1]
                children[id(stack[-1])] += 1
            stack.append(op)
    return {
        id(op)
        for op in ops
        if id(op) in parent
        and parent[id(op)]["name"] == op["name"]
        and children[id(parent[id(op)])] == 1
    }


def wrap_with_markers(path: Path, out: Path, name: str, every: int = 2) -> tuple[Path, dict]:
    """Wrap alternate runs of the main thread's root operators in a marker range, as the
    decorator (one range per call) or the callback (one per training step) does.

    Returns the new file and what the rules must count, worked out here from scratch:
    operator calls (marker thread: inside a range; other threads: trees whose root starts in
    one), the device time that their runtime calls launched and the marker count.
    """
    whole = json.loads(gzip.decompress(path.read_bytes()))
    events = whole["traceEvents"]
    ops = [e for e in events if _is_op(e)]
    main = Counter((e["pid"], e["tid"]) for e in ops if e["pid"] == e["tid"]).most_common(1)[0][0]
    trees = _roots([e for e in ops if (e["pid"], e["tid"]) == main])
    while len(trees) < 4:  # few roots (one around everything): mark a level further down
        trees = _roots([e for _, tree in trees for e in tree[1:]])
    chunk = max(1, len(trees) // 12)
    ranges, before = [], {}
    ends = [max(e["ts"] + e.get("dur", 0) for e in tree) for _, tree in trees]
    for i in range(0, len(trees), chunk * every):
        last = min(i + chunk, len(trees)) - 1
        gap_before = trees[i][0]["ts"] - ends[i - 1] if i else 1.0
        gap_after = trees[last + 1][0]["ts"] - ends[last] if last + 1 < len(trees) else 1.0
        start = trees[i][0]["ts"] - min(0.5, gap_before / 2)
        end = ends[last] + min(0.5, gap_after / 2)
        ranges.append((start, end))
        before[id(trees[i][0])] = {
            "ph": "X", "cat": "user_annotation", "name": name, "pid": main[0], "tid": main[1],
            "ts": start, "dur": end - start,
        }  # fmt: skip

    def inside(t: float) -> bool:
        return any(start <= t <= end for start, end in ranges)

    counted = [e for e in ops if (e["pid"], e["tid"]) == main and inside(e["ts"])]
    for key in {(e["pid"], e["tid"]) for e in ops} - {main}:
        for root, tree in _roots([e for e in ops if (e["pid"], e["tid"]) == key]):
            if key[0] == main[0] and inside(root["ts"]):
                counted += tree
    folded = _folded(ops)
    calls = Counter(e["name"] for e in counted if id(e) not in folded)
    # a runtime call counts when an operator around it counts (the innermost one: any will do)
    spans: dict[tuple, list[tuple[float, float]]] = {}
    for e in counted:
        spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e.get("dur", 0)))
    calls_made = [
        e
        for e in events
        if e.get("cat") in RUNTIME
        and any(a <= e["ts"] <= b for a, b in spans.get((e["pid"], e["tid"]), []))
    ]
    calls += Counter(e["name"] for e in calls_made)  # runtime calls are rows of their own
    launched = {e["args"]["correlation"] for e in calls_made if "correlation" in e["args"]}
    device_us = sum(
        e.get("dur", 0)
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in DEVICE
        and (e.get("args") or {}).get("correlation") in launched
    )
    # each marker written just before the first operator it wraps, as torch writes them
    whole["traceEvents"] = [
        m for e in events for m in ([before[id(e)]] if id(e) in before else []) + [e]
    ]
    out.write_text(json.dumps(whole))
    return out, {"calls": calls, "device_us": device_us, "markers": len(ranges)}


def window_totals(result: TraceResult) -> tuple[Counter, float]:
    s = result.summary
    calls = Counter({op.name: round(op.calls * s.steps) for op in s.ops})
    return calls, sum((op.self_device_us or 0.0) * s.steps for op in s.ops)


@pytest.mark.parametrize("marker", [call_marker("f"), TRAIN_STEP_MARKER])
@pytest.mark.parametrize("path", DEVICE_TRACES, ids=lambda p: p.name)
def test_device_time_is_conserved_inside_marked_ranges(path, marker, tmp_path, caplog) -> None:
    marked, expected = wrap_with_markers(path, tmp_path / "marked.json", marker)
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    result = summarize_trace(marked)
    assert FALLBACK not in caplog.text
    assert result.marked
    calls, ops_device_us = window_totals(result)
    assert calls == expected["calls"]  # the same operators, the same calls; markers not ops
    assert all(not op.name.startswith("neuron_mlflow") for op in result.summary.ops)
    kernels_inside = expected["device_us"]
    total = (result.summary.device_time_us or 0.0) * result.summary.steps
    assert total == pytest.approx(kernels_inside, rel=1e-9)  # the device total: inside only
    assert ops_device_us <= kernels_inside * (1 + 1e-9)  # never more than the kernels inside
    assert ops_device_us == pytest.approx(kernels_inside, rel=0.01)  # and within 1%
    everything = window_totals(summarize_trace(path))
    assert calls != everything[0]  # some work was left out
    assert ops_device_us < everything[1] or everything[1] == 0


@pytest.mark.parametrize(
    "layout", [cpu_first, device_first, runtime_first], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("path", DEVICE_TRACES, ids=lambda p: p.name)
def test_marked_traces_give_the_same_numbers_in_any_layout(path, layout, tmp_path) -> None:
    marked, _ = wrap_with_markers(path, tmp_path / "marked.json", call_marker("f"))
    whole = json.loads(marked.read_text())
    whole["traceEvents"] = layout(whole["traceEvents"])
    relaid = tmp_path / "relaid.json"
    relaid.write_text(json.dumps(whole))
    exact = buffered(marked)
    assert_same(summarize_trace(relaid), exact)
    assert_same(summarize_trace(marked), exact)


def _trace(tmp_path: Path, events: list[dict], name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def decorated_calls(marker_last: bool = False) -> list[dict]:
    """Two profiled steps: each a call marker with an op launching a kernel, plus work
    between calls (an op with its own kernel) and an autograd-thread tree inside the call."""
    events: list[dict] = []
    markers: list[dict] = []
    for step in range(2):
        t = step * 100.0
        c = step * 10
        events += [
            _x("user_annotation", f"ProfilerStep#{step}", t, 99),
            _x("user_annotation", "outer user range", t + 1, 97),
            _x("cpu_op", "aten::mul", t + 3, 10),
            _x("cuda_runtime", "cudaLaunchKernel", t + 4, 2, correlation=c + 1),
            _x("kernel", "mul_kernel", t + 20, 5, tid=7, correlation=c + 1),
            _x("cuda_runtime", "cudaDeviceSynchronize", t + 30, 1),
            _x("cpu_op", "autograd::engine::evaluate_function: MulBackward0", t + 12, 20, tid=2),
            _x("cpu_op", "aten::mul", t + 13, 5, tid=2),
            _x("cuda_runtime", "cudaLaunchKernel", t + 14, 1, tid=2, correlation=c + 2),
            _x("kernel", "mul_kernel", t + 40, 3, tid=7, correlation=c + 2),
            _x("cpu_op", "aten::add", t + 60, 10),  # between calls: left out
            _x("cuda_runtime", "cudaLaunchKernel", t + 61, 2, correlation=c + 3),
            _x("kernel", "add_kernel", t + 70, 50, tid=7, correlation=c + 3),
            _x("cpu_op", "aten::copy_", t + 80, 3, tid=2),  # another thread, outside
        ]
        markers.append(_x("user_annotation", call_marker("f"), t + 2, 40))
    if marker_last:
        return events + markers
    return sorted(events + markers, key=lambda e: (e["tid"], e["ts"], -e["dur"]))


@pytest.mark.parametrize("marker_last", [False, True], ids=["in order", "markers last"])
def test_a_decorated_function_counts_only_what_runs_inside_its_calls(tmp_path, marker_last):
    result = summarize_trace(_trace(tmp_path, decorated_calls(marker_last)))
    s = result.summary
    assert s.steps == 2 and result.marked
    ops = {op.name: op for op in s.ops}
    assert set(ops) == {
        "aten::mul",
        "autograd::engine::evaluate_function: MulBackward0",
        "cudaLaunchKernel",  # a runtime call is a row (the one between calls is left out)
    }
    assert ops["aten::mul"].calls == 2  # one on the training thread, one on autograd's
    assert ops["cudaLaunchKernel"].calls == 2 and ops["cudaLaunchKernel"].self_cpu_us == 3.0
    assert ops["aten::mul"].self_cpu_us == pytest.approx(12.0)  # (10 - 2) + (5 - 1)
    assert s.op_calls == 2  # per step: the call's aten::mul and the autograd tree's root
    assert ops["aten::mul"].self_device_us == pytest.approx(8.0)  # 5 + 3, each kernel once
    assert s.device_time_us == pytest.approx(8.0) and result.kernels == {"mul_kernel": 16.0}
    assert s.wall_time_us == pytest.approx(40.0)  # the call, not the whole ProfilerStep
    assert result.unattributed_device_events == 0


def test_without_markers_everything_in_the_window_counts(tmp_path) -> None:
    events = [e for e in decorated_calls() if not e["name"].startswith("neuron_mlflow")]
    result = summarize_trace(_trace(tmp_path, events))
    s = result.summary
    assert not result.marked
    assert {op.name for op in s.ops} >= {"aten::add", "aten::copy_", "outer user range"}
    assert s.device_time_us == pytest.approx(58.0) and s.wall_time_us == pytest.approx(99.0)


def test_validation_between_training_steps_is_left_out(tmp_path) -> None:
    """A training window whose second step is followed by a validation loop and a
    checkpoint save: the same ops and calls as one without them."""

    def window(with_validation: bool) -> list[dict]:
        events = []
        for step in range(3):
            t = step * 1000.0
            events += [
                _x("user_annotation", f"ProfilerStep#{step}", t, 999),
                _x("user_annotation", TRAIN_STEP_MARKER, t + 1, 100),
                _x("cpu_op", "aten::linear", t + 2, 50),
                _x("cpu_op", "aten::addmm", t + 3, 40),
            ]
            if with_validation and step == 1:
                events += [_x("cpu_op", "aten::linear", t + 200 + 10 * i, 5) for i in range(30)]
                events.append(_x("cpu_op", "aten::save", t + 600, 100))
        return events

    plain = summarize_trace(_trace(tmp_path, window(False), "plain.json")).summary
    validated = summarize_trace(_trace(tmp_path, window(True), "validated.json")).summary
    assert validated.op_calls == plain.op_calls == 1
    assert [(op.name, op.calls) for op in validated.ops] == [
        (op.name, op.calls) for op in plain.ops
    ]
