"""Per-operator numbers by torch's own rules (``key_averages()``), field by field.

An operator's self CPU leaves out its child operators and the runtime calls it makes; its
CPU and device totals hold all its descendants; its self device time is what it launched
itself; runtime calls are rows of their own. Hand-made traces check each rule on every field
of every row; the real CUDA and ROCm traces are checked against a plain reference of the same
rules written here (every event in memory, torch's tree algorithm); live CPU windows against
``key_averages()`` of the same profiler.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from torch.profiler import ProfilerActivity, profile, schedule

from neuron_mlflow.naming import TRAIN_STEP_MARKER
from neuron_mlflow.trace.summarize import TraceResult, summarize_trace
from tests.helpers import ROOT, inputs, rmsnorm_fused, rmsnorm_naive
from tests.trace.test_rules import call_marker, wrap_with_markers

REAL = sorted((ROOT / "tests" / "data" / "traces").glob("*.json.gz"))
DEVICE_TRACES = [p for p in REAL if not p.name.startswith("cpu_only")]
OPS = {"cpu_op", "user_annotation", "Operator"}
RUNTIME = {"cuda_runtime", "cuda_driver", "privateuse1_runtime", "mtia_runtime", "Runtime"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "privateuse1_driver", "Kernel", "Memcpy", "Memset"}
Row = tuple[float, float, float, float, float]  # calls, self CPU, CPU total, self/total device


def x(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def op(name: str, ts: float, dur: float, ext: int | None = None, tid: int = 1) -> dict:
    return x("cpu_op", name, ts, dur, tid, **({} if ext is None else {"External id": ext}))


def launch(ts: float, dur: float, corr: int, ext: int | None = None, tid: int = 1,
           name: str = "cudaLaunchKernel") -> dict:  # fmt: skip
    args = {"correlation": corr} | ({} if ext is None else {"External id": ext})
    return x("cuda_runtime", name, ts, dur, tid, **args)


def kernel(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict:
    return x(cat, name, ts, dur, tid=7, pid=0, correlation=corr)


def write(tmp_path: Path, events: list[dict], name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def rows(result: TraceResult) -> dict[str, Row]:
    """Every row as window totals: (calls, self CPU, CPU total, self device, device total)."""
    s = result.summary
    return {
        op.name: (
            op.calls * s.steps,
            op.self_cpu_us * s.steps,
            op.cpu_total_us * s.steps,
            (op.self_device_us or 0.0) * s.steps,
            (op.device_total_us or 0.0) * s.steps,
        )
        for op in s.ops
    }


def assert_rows(got: dict[str, Row], want: dict[str, Row], tolerance: float = 1e-6) -> None:
    assert set(got) == set(want)
    for name, row in want.items():
        assert got[name] == pytest.approx(row, abs=tolerance), name


# -- the worked example ---------------------------------------------------------------


def linear_example() -> list[dict]:
    return [
        op("aten::linear", 0, 100, ext=1),
        op("aten::addmm", 10, 50, ext=2),
        launch(20, 8, corr=7, ext=2),
        launch(70, 5, corr=8, ext=1),
        kernel("gemm", 200, 30, corr=7),
        kernel("bias", 240, 5, corr=8),
    ]


def test_the_worked_example_gives_torchs_table(tmp_path) -> None:
    result = summarize_trace(write(tmp_path, linear_example()))
    assert_rows(
        rows(result),
        {
            "aten::linear": (1, 45, 100, 5, 35),
            "aten::addmm": (1, 42, 50, 30, 30),
            "cudaLaunchKernel": (2, 13, 13, 0, 0),
        },
    )
    s = result.summary
    assert s.cpu_time_us == 100 and s.device_time_us == 35 and s.op_calls == 1
    assert sum(op.self_cpu_us for op in s.ops) == s.cpu_time_us
    assert result.kernels == {"gemm": 30, "bias": 5} and result.unattributed_device_events == 0


def test_the_same_example_without_ids_nests_by_time(tmp_path) -> None:
    events = linear_example()
    for event in events:
        event["args"].pop("External id", None)
    assert_rows(
        rows(summarize_trace(write(tmp_path, events))),
        {
            "aten::linear": (1, 45, 100, 5, 35),
            "aten::addmm": (1, 42, 50, 30, 30),
            "cudaLaunchKernel": (2, 13, 13, 0, 0),
        },
    )


# -- nesting, runtime rows, inclusive totals ----------------------------------------------------


def test_device_total_holds_every_descendant(tmp_path) -> None:
    events = [
        op("aten::conv2d", 0, 100, ext=1),
        op("aten::convolution", 5, 90, ext=2),
        op("aten::cudnn_convolution", 10, 80, ext=3),
        launch(20, 10, corr=1, ext=3),
        launch(40, 4, corr=2, ext=3, name="cudaMemcpyAsync"),
        op("aten::add_", 100, 20, ext=4),  # a second root, its own kernel
        launch(105, 5, corr=3, ext=4),
        kernel("conv_kernel", 300, 60, corr=1),
        kernel("Memcpy DtoD", 360, 7, corr=2, cat="gpu_memcpy"),
        kernel("add_kernel", 400, 3, corr=3),
    ]
    result = summarize_trace(write(tmp_path, events))
    assert_rows(
        rows(result),
        {
            "aten::conv2d": (1, 10, 100, 0, 67),
            "aten::convolution": (1, 10, 90, 0, 67),
            "aten::cudnn_convolution": (1, 66, 80, 67, 67),
            "aten::add_": (1, 15, 20, 3, 3),
            "cudaLaunchKernel": (2, 15, 15, 0, 0),
            "cudaMemcpyAsync": (1, 4, 4, 0, 0),
        },
    )
    assert result.summary.cpu_time_us == 120 and result.summary.device_time_us == 70
    assert result.summary.op_calls == 2  # runtime calls are never top-level calls


def test_a_blocking_copy_is_a_runtime_row_not_the_operators_own_time(tmp_path) -> None:
    events = [
        op("aten::copy_", 0, 1000, ext=1),
        launch(2, 996, corr=1, ext=1, name="cudaMemcpyAsync"),  # waits for the device
        kernel("Memcpy DtoH", 900, 90, corr=1, cat="gpu_memcpy"),
    ]
    assert_rows(
        rows(summarize_trace(write(tmp_path, events))),
        {"aten::copy_": (1, 4, 1000, 90, 90), "cudaMemcpyAsync": (1, 996, 996, 0, 0)},
    )


def test_a_runtime_call_outside_every_operator_is_not_a_row(tmp_path) -> None:
    events = [
        op("aten::mul", 0, 10, ext=1),
        launch(2, 3, corr=1, ext=1),
        launch(20, 5, corr=2, name="cudaDeviceSynchronize"),  # no operator around it
        launch(30, 2, corr=3),  # launches a kernel from no operator
        kernel("mul_kernel", 40, 4, corr=1),
        kernel("lone_kernel", 50, 6, corr=3),
    ]
    result = summarize_trace(write(tmp_path, events))
    assert_rows(rows(result), {"aten::mul": (1, 7, 10, 4, 4), "cudaLaunchKernel": (1, 3, 3, 0, 0)})
    assert result.summary.cpu_time_us == 10  # the window's CPU time: the operators' own
    assert result.summary.device_time_us == 10 and result.unattributed_device_events == 1


def test_an_only_child_of_the_same_name_folds_with_its_kernels(tmp_path) -> None:
    events = [
        op("aten::div", 0, 20, ext=1),
        op("aten::div", 1, 18, ext=2),  # the redispatch: folded into its parent
        launch(3, 5, corr=1, ext=2),
        kernel("div_kernel", 50, 9, corr=1),
        op("aten::to", 30, 20, ext=3),
        launch(31, 2, corr=2, ext=3, name="cudaStreamSynchronize"),  # a child: no fold
        op("aten::to", 35, 10, ext=4),
        launch(36, 2, corr=3, ext=4),
        kernel("to_kernel", 60, 4, corr=3),
    ]
    assert_rows(
        rows(summarize_trace(write(tmp_path, events))),
        {
            "aten::div": (1, 15, 20, 9, 9),
            "aten::to": (2, 8 + 8, 30, 4, 8),
            "cudaLaunchKernel": (2, 7, 7, 0, 0),
            "cudaStreamSynchronize": (1, 2, 2, 0, 0),
        },
    )


# -- ids first ----------------------------------------------------------------------------------


def tied_launches(with_ids: bool) -> list[dict]:
    """Back-to-back operators on a coarse clock: zero-length launches at their edges."""
    ext = (lambda n: n) if with_ids else (lambda n: None)
    return [
        op("aten::add", 0, 10, ext=ext(1)),
        op("aten::mul", 10, 10, ext=ext(2)),
        launch(10, 0, corr=1, ext=ext(1)),  # add's last microsecond
        launch(10, 0, corr=2, ext=ext(2)),  # mul's first
        op("aten::sum", 30, 20, ext=ext(3)),
        op("aten::fill_", 30, 5, ext=ext(4)),
        launch(30, 0, corr=3, ext=ext(3)),  # sum's own launch, at its child's start
        kernel("add_kernel", 100, 1, corr=1),
        kernel("mul_kernel", 110, 2, corr=2),
        kernel("sum_kernel", 120, 4, corr=3),
    ]


def test_ids_join_launches_where_timestamps_tie(tmp_path) -> None:
    assert_rows(
        rows(summarize_trace(write(tmp_path, tied_launches(with_ids=True)))),
        {
            "aten::add": (1, 10, 10, 1, 1),
            "aten::mul": (1, 10, 10, 2, 2),
            "aten::sum": (1, 15, 20, 4, 4),
            "aten::fill_": (1, 5, 5, 0, 0),
            "cudaLaunchKernel": (3, 0, 0, 0, 0),
        },
    )


def test_without_ids_a_tied_launch_goes_to_the_innermost_operator_open_then(tmp_path) -> None:
    assert_rows(
        rows(summarize_trace(write(tmp_path, tied_launches(with_ids=False)))),
        {
            "aten::add": (1, 10, 10, 0, 0),
            "aten::mul": (1, 10, 10, 3, 3),  # both launches at 10: mul has started
            "aten::sum": (1, 15, 20, 0, 4),
            "aten::fill_": (1, 5, 5, 4, 4),
            "cudaLaunchKernel": (3, 0, 0, 0, 0),
        },
    )


def test_an_id_that_names_no_operator_around_the_call_falls_back_to_time(tmp_path) -> None:
    """Older CUDA traces write the correlation into the runtime call's External id: an id of
    some other operator, or of one that does not hold the call, is not a link."""
    events = [
        op("aten::empty", 0, 5, ext=7),
        op("aten::relu", 10, 10, ext=8),
        launch(12, 2, corr=7, ext=7),  # "External id" 7: aten::empty, long over
        kernel("relu_kernel", 50, 3, corr=7),
    ]
    assert_rows(
        rows(summarize_trace(write(tmp_path, events))),
        {
            "aten::empty": (1, 5, 5, 0, 0),
            "aten::relu": (1, 8, 10, 3, 3),
            "cudaLaunchKernel": (1, 2, 2, 0, 0),
        },
    )


# -- threads ------------------------------------------------------------------------------------


def test_two_threads_keep_their_own_trees(tmp_path) -> None:
    events = [
        op("aten::mm", 0, 50, ext=1, tid=1),
        op("aten::add", 10, 20, ext=2, tid=2),  # overlaps mm in time, on another thread
        launch(15, 4, corr=1, ext=2, tid=2),
        launch(20, 6, corr=2, ext=1, tid=1),
        launch(25, 1, corr=3, ext=1, tid=2),  # mm's id, but made on thread 2: time rule
        kernel("add_kernel", 60, 5, corr=1),
        kernel("mm_kernel", 70, 11, corr=2),
        kernel("add_kernel", 90, 2, corr=3),
    ]
    result = summarize_trace(write(tmp_path, events))
    assert_rows(
        rows(result),
        {
            "aten::mm": (1, 44, 50, 11, 11),
            "aten::add": (1, 15, 20, 7, 7),
            "cudaLaunchKernel": (3, 11, 11, 0, 0),
        },
    )
    assert result.summary.op_calls == 2


def test_autograds_backward_thread(tmp_path) -> None:
    backward = "autograd::engine::evaluate_function: MmBackward0"
    events = [
        x("user_annotation", "ProfilerStep#0", 0, 200),
        op("aten::mm", 1, 30, ext=1),
        launch(5, 5, corr=1, ext=1),
        op("aten::sum", 40, 10, ext=2),
        launch(42, 3, corr=2, ext=2),
        op(backward, 60, 100, ext=3, tid=2),
        op("MmBackward0", 61, 90, ext=4, tid=2),
        op("aten::mm", 62, 40, ext=5, tid=2),
        launch(63, 6, corr=3, ext=5, tid=2),
        op("aten::mm", 110, 30, ext=6, tid=2),
        launch(111, 6, corr=4, ext=6, tid=2),
        kernel("gemm", 300, 20, corr=1),
        kernel("reduce", 330, 2, corr=2),
        kernel("gemm", 340, 21, corr=3),
        kernel("gemm", 370, 19, corr=4),
    ]
    result = summarize_trace(write(tmp_path, events))
    assert_rows(
        rows(result),
        {
            "aten::mm": (3, 25 + 34 + 24, 100, 60, 60),
            "aten::sum": (1, 7, 10, 2, 2),
            backward: (1, 10, 100, 0, 40),
            "MmBackward0": (1, 20, 90, 0, 40),
            "cudaLaunchKernel": (4, 20, 20, 0, 0),
        },
    )
    assert result.summary.steps == 1 and result.summary.op_calls == 3


# -- a device event with no launch --------------------------------------------------------------


def test_a_device_event_with_no_launch_counts_in_the_window_but_in_no_row(tmp_path) -> None:
    events = [
        op("aten::mul", 0, 10, ext=1),
        launch(2, 2, corr=1, ext=1),
        kernel("mul_kernel", 20, 5, corr=1),
        kernel("nccl_kernel", 30, 40, corr=99),  # its runtime call is not in the trace
    ]
    result = summarize_trace(write(tmp_path, events))
    assert_rows(rows(result), {"aten::mul": (1, 8, 10, 5, 5), "cudaLaunchKernel": (1, 2, 2, 0, 0)})
    assert result.summary.device_time_us == 45 and result.unattributed_device_events == 1
    assert result.kernels == {"mul_kernel": 5, "nccl_kernel": 40}


# -- PyTorch <= 1.9 names -----------------------------------------------------------------------


def legacy(events: list[dict]) -> list[dict]:
    """The same events as PyTorch 1.9 wrote them: its categories, ``external id`` on runtime
    calls and device events, ``ProfilerStep#N`` an ``Operator``."""
    names = {"cpu_op": "Operator", "user_annotation": "Operator", "cuda_runtime": "Runtime",
             "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}  # fmt: skip
    out = []
    for event in events:
        event = json.loads(json.dumps(event))
        if event["cat"] not in ("cpu_op", "user_annotation") and "External id" in event["args"]:
            event["args"]["external id"] = event["args"].pop("External id")
        event["cat"] = names[event["cat"]]
        out.append(event)
    return out


def stepped_trace() -> list[dict]:
    events = []
    for step in range(2):
        t, e = 1000.0 * step, 10 * step
        events += [
            x("user_annotation", f"ProfilerStep#{step}", t, 900),
            op("aten::linear", t + 10, 100, ext=e + 1),
            op("aten::addmm", t + 20, 50, ext=e + 2),
            launch(t + 30, 8, corr=e + 1, ext=e + 2),
            launch(t + 70, 0, corr=e + 2, ext=e + 1),
            op("aten::zero_", t + 120, 10, ext=e + 3),
            launch(t + 125, 2, corr=e + 3, ext=e + 3, name="cudaMemsetAsync"),
            kernel("gemm", t + 300, 30, corr=e + 1),
            kernel("bias", t + 340, 5, corr=e + 2),
            kernel("Memset (Device)", t + 350, 1, corr=e + 3, cat="gpu_memset"),
        ]
    return events


def test_a_pytorch_1_9_trace_reads_as_the_same_events_with_todays_names(tmp_path) -> None:
    today = summarize_trace(write(tmp_path, stepped_trace(), "today.json"))
    old = summarize_trace(write(tmp_path, legacy(stepped_trace()), "old.json"))
    want = {
        "aten::linear": (2, 2 * 50, 200, 2 * 5, 2 * 35),
        "aten::addmm": (2, 2 * 42, 100, 2 * 30, 2 * 30),
        "aten::zero_": (2, 2 * 8, 20, 2 * 1, 2 * 1),
        "cudaLaunchKernel": (4, 2 * 8, 2 * 8, 0, 0),
        "cudaMemsetAsync": (2, 2 * 2, 2 * 2, 0, 0),
    }
    assert_rows(rows(today), want)
    assert_rows(rows(old), want)
    assert old.summary == today.summary and old.kernels == today.kernels
    assert old.summary.steps == 2 and old.summary.wall_time_us == 900
    assert old.summary.device_label == "CUDA" and old.summary.device_time_us == 36


# -- the reference on real traces ---------------------------------------------------------------


def reference(path: Path) -> dict[str, Row]:
    """torch's rules worked out plainly, every event in memory: per thread, operators and
    runtime calls in one tree (sorted by start, longer first; a child starts before its
    parent's end and ends by it, as ``EventList._populate_cpu_children``), a runtime call under
    the operator its External id names when that one holds it (else the innermost operator
    open at its start), only children of the same name folded with their kernels
    (``_remove_dup_nodes``), device events to the operator of the runtime call with their
    correlation. Step markers are not operators; a runtime call outside every operator is not
    a row (the window's CPU time is the operators')."""
    whole = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in whole["traceEvents"] if e.get("ph") == "X"]
    threads: dict[tuple, list[dict]] = defaultdict(list)
    for i, e in enumerate(events):
        e["_i"], e["_end"] = i, e["ts"] + e.get("dur", 0)
        cat, name = e.get("cat"), e.get("name", "")
        if (cat in OPS and not name.startswith("ProfilerStep#")) or cat in RUNTIME:
            threads[(e["pid"], e["tid"])].append(e)
    parent: dict[int, dict | None] = {}
    for evs in threads.values():
        ops = sorted(
            (e for e in evs if e["cat"] in OPS), key=lambda e: (e["ts"], -e["dur"], e["_i"])
        )
        stack: list[dict] = []
        for e in ops:
            while stack and (e["ts"] >= stack[-1]["_end"] or e["_end"] > stack[-1]["_end"]):
                stack.pop()
            parent[e["_i"]] = stack[-1] if stack else None
            stack.append(e)
        by_id = {o["args"]["External id"]: o for o in ops if "External id" in o.get("args", {})}
        for call in (e for e in evs if e["cat"] in RUNTIME):
            args = call.get("args") or {}
            named = by_id.get(args.get("External id", args.get("external id")))
            if named is not None and named["ts"] <= call["ts"] and call["_end"] <= named["_end"]:
                parent[call["_i"]] = named
                continue
            open_then = [o for o in ops if o["ts"] <= call["ts"] <= o["_end"]]
            parent[call["_i"]] = max(open_then, key=lambda o: (o["ts"], -o["dur"], o["_i"]),
                                     default=None)  # fmt: skip
    children: dict[int, list[dict]] = defaultdict(list)
    nodes = [e for evs in threads.values() for e in evs if parent.get(e["_i"]) or e["cat"] in OPS]
    for e in nodes:
        if parent[e["_i"]] is not None:
            children[parent[e["_i"]]["_i"]].append(e)
    launcher = {e["args"]["correlation"]: parent[e["_i"]] for e in nodes
                if e["cat"] in RUNTIME and "correlation" in (e.get("args") or {})}  # fmt: skip
    kernels: dict[int, float] = defaultdict(float)
    for e in events:
        owner = launcher.get((e.get("args") or {}).get("correlation"))
        if e.get("cat") in DEVICE and owner is not None:
            kernels[owner["_i"]] += e.get("dur", 0)
    alive = {e["_i"]: e for e in nodes}
    changed = True
    while changed:  # torch's _remove_dup_nodes, to a fixed point
        changed = False
        for e in sorted(alive.values(), key=lambda e: e["_i"]):
            p = parent[e["_i"]]
            if p is not None and p["name"] == e["name"] and len(children[p["_i"]]) == 1:
                children[p["_i"]] = children.pop(e["_i"], [])
                kernels[p["_i"]] = kernels.pop(e["_i"], 0.0)
                for child in children[p["_i"]]:
                    parent[child["_i"]] = p
                del alive[e["_i"]]
                changed = True

    def device_total(e: dict) -> float:
        return kernels.get(e["_i"], 0.0) + sum(device_total(c) for c in children[e["_i"]])

    table: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
    for e in alive.values():
        row = table[e["name"]]
        own = kernels.get(e["_i"], 0.0)
        row[0] += 1
        row[1] += e["dur"] - sum(c["dur"] for c in children[e["_i"]])
        row[2] += e["dur"]
        row[3] += own
        row[4] += device_total(e)
    return {name: (r[0], r[1], r[2], r[3], r[4]) for name, r in table.items()}


@pytest.mark.parametrize("path", DEVICE_TRACES, ids=lambda p: p.name)
def test_real_traces_follow_torchs_rules_on_every_row(path: Path) -> None:
    want = reference(path)
    got = rows(summarize_trace(path))
    assert set(got) == set(want)
    for name, row in want.items():
        assert got[name] == pytest.approx(row, abs=1.0), name  # within 1 us per row
    runtime = [name for name in got if name.startswith(("cuda", "hip"))]
    assert runtime, "the runtime calls are rows"


# -- what the window's headline numbers were before this rule, unchanged ------------------------

BEFORE = {  # P/cpu_time_us, P/device_time_us before runtime rows (b6dd293), per marking
    "cpu_only_rank34.json.gz": {"plain": (2135459.882, None), "marked": (1.452, None)},
    "cuda_alexnet_benchmark.json.gz": {
        "plain": (43425283.0, 66203.0),
        "marked": (6160642.857142857, 3849.4285714285716),
    },
    "cuda_cupti_counters.json.gz": {
        "plain": (11843523.0, 9350187.0),
        "marked": (1546927.5714285714, None),
    },
    "cuda_sampled_rank0.json.gz": {
        "plain": (639089.0, 303922.0),
        "marked": (105771.125, 58938.625),
    },
    "rocm_mi250_minitoy_train.json.gz": {
        "plain": (4374.906499999999, 74.521),
        "marked": (110.0406, 5.568),
    },
}


@pytest.mark.parametrize("marker", [None, call_marker("f"), TRAIN_STEP_MARKER])
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_windows_cpu_and_device_time_are_unchanged(path, marker, tmp_path) -> None:
    cpu, device = BEFORE[path.name]["plain" if marker is None else "marked"]
    if marker is not None:
        path, _ = wrap_with_markers(path, tmp_path / "marked.json", marker)
    s = summarize_trace(path).summary
    assert s.cpu_time_us == pytest.approx(cpu, rel=1e-12)
    assert (s.device_time_us is None) == (device is None)
    if device is not None:
        assert s.device_time_us == pytest.approx(device, rel=1e-12)
    assert sum(op.self_cpu_us for op in s.ops) == pytest.approx(s.cpu_time_us, rel=1e-12)


# -- live CPU windows against key_averages() ----------------------------------------------------


def torch_table(prof) -> dict[str, Row]:
    """``key_averages()`` of the window, step markers left out (not operators here)."""
    return {
        a.key: (a.count, a.self_cpu_time_total, a.cpu_time_total, 0.0, 0.0)
        for a in prof.key_averages()
        if not a.key.startswith("ProfilerStep")  # "ProfilerStep*": torch merges them
    }


def assert_like_torch(got: dict[str, Row], want: dict[str, Row]) -> None:
    """Every row: the same calls, self CPU and CPU total within 1 % or 1 us."""
    assert set(got) == set(want)
    for name, (calls, self_cpu, total, _, _) in want.items():
        mine = got[name]
        assert mine[0] == calls, name
        assert mine[1] == pytest.approx(self_cpu, rel=0.01, abs=1.0), name
        assert mine[2] == pytest.approx(total, rel=0.01, abs=1.0), name


def profiled_steps(tmp_path: Path, step, steps: int = 3) -> tuple[dict[str, Row], TraceResult]:
    seen = {}

    def ready(prof) -> None:
        seen["torch"] = torch_table(prof)
        prof.export_chrome_trace(str(tmp_path / "window.json"))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=steps),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    return seen["torch"], summarize_trace(tmp_path / "window.json")


@pytest.mark.parametrize("fn", [rmsnorm_naive, rmsnorm_fused], ids=lambda f: f.__name__)
def test_a_live_rmsnorm_window_equals_key_averages(fn, tmp_path) -> None:
    x, w = inputs(256)
    want, result = profiled_steps(tmp_path, lambda: fn(x, w))
    got = rows(result)
    assert_like_torch(got, want)
    assert result.summary.steps == 3 and len(got) >= (6 if fn is rmsnorm_naive else 1)


def test_a_live_lightning_step_window_equals_key_averages(tmp_path) -> None:
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    seen = {}

    def ready(prof) -> None:
        seen["torch"] = torch_table(prof)
        prof.export_chrome_trace(str(tmp_path / "window.json"))

    class Steps(Callback):  # a plain torch profiler stepped by Lightning's training steps
        def on_train_start(self, trainer, module) -> None:
            self.prof = profile(
                activities=[ProfilerActivity.CPU],
                schedule=schedule(wait=1, warmup=1, active=3),
                on_trace_ready=ready,
            )
            self.prof.start()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.prof.step()

        def on_train_end(self, trainer, module) -> None:
            self.prof.stop()

    trainer = Trainer(
        accelerator="cpu", max_steps=6, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Steps()],
    )  # fmt: skip
    trainer.fit(BoringModel())
    result = summarize_trace(tmp_path / "window.json")
    got = rows(result)
    assert_like_torch(got, seen["torch"])
    assert result.summary.steps == 3 and "aten::addmm" in got
