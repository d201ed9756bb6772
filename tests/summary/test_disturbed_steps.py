"""Steps that other processes disturbed: recorded, marked and left out of every verdict.

A live window records per step the run-queue wait of the process's threads and its
involuntary switches (in the trace's metadata); ``steps.jsonl`` says which steps were
disturbed, ``report.html`` marks them, and ``compare`` leaves them out or, when they are most
of a side, says ``insufficient data (N of M steps disturbed by other processes)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.naming import STEP_INTERFERENCE_KEY
from neuron_mlflow.summary.ops import RawOp, build_summary
from neuron_mlflow.trace.step_samples import read_step_samples, write_step_samples
from neuron_mlflow.trace.window_report import write_window_report

# per step: wall time (us), run-queue wait (us), involuntary switches
STEPS = [(100.0, 0.0, 0), (100.0, 2.0, 0), (2700.0, 3100.0, 4), (100.0, 4.0, 1)]


def _trace(folder: Path, interference: list[list[float | int]] | None) -> Path:
    events, t = [], 0.0
    for i, (wall, _, _) in enumerate(STEPS):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1,
             "tid": 1, "ts": t, "dur": wall},
            {"ph": "X", "cat": "user_annotation", "name": "neuron_mlflow: f", "pid": 1,
             "tid": 1, "ts": t + 0.5, "dur": wall - 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1,
             "ts": t + 1, "dur": wall / 2},
        ]  # fmt: skip
        t += wall + 10
    document: dict = {"traceEvents": events}
    if interference is not None:
        document = {STEP_INTERFERENCE_KEY: interference, **document}
    (folder / "traces").mkdir(parents=True)
    path = folder / "traces" / "t.json"
    path.write_text(json.dumps(document))
    return path


def test_steps_jsonl_and_report_mark_the_disturbed_steps(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [[wait, switches] for _, wait, switches in STEPS])
    write_step_samples(tmp_path, tmp_path / "traces", top_k=3)
    heads, _ = read_step_samples((tmp_path / "steps.jsonl").read_text())
    # 5 % of the step's wall time waiting for a CPU: disturbed (a switch alone is not, when
    # the wait is known: 4 us of 100)
    assert [h["disturbed"] for h in heads] == [False, False, True, False]
    assert [h["cpu_wait_us"] for h in heads] == [0.0, 2.0, 3100.0, 4.0]
    assert [h["involuntary_switches"] for h in heads] == [0, 0, 4, 1]

    summary = build_summary([RawOp("aten::mul", 4, 50.0, 50.0)], 4, 4, 750.0)
    manifest = {"window": {"first": 10, "last": 13}, "artifact_path": "profile/step_10-13"}
    page = write_window_report(tmp_path, summary, manifest, trace=trace).read_text()
    assert "1 of 4 steps disturbed by other processes" in page
    assert page.count("\u26a0</span>") == 1
    assert 'title="disturbed by other processes: waited 3.100 ms for a CPU">step 12' in page


def test_a_trace_that_does_not_say_leaves_disturbed_unknown(tmp_path: Path) -> None:
    _trace(tmp_path, None)  # an ingested trace, say
    write_step_samples(tmp_path, tmp_path / "traces", top_k=3)
    heads, _ = read_step_samples((tmp_path / "steps.jsonl").read_text())
    assert {h["disturbed"] for h in heads} == {None}
    assert {h["cpu_wait_us"] for h in heads} == {None}


@pytest.mark.skipif(sys.platform != "linux", reason="run-queue wait is read from Linux /proc")
def test_a_live_window_records_each_steps_wait_and_switches(tracking_uri) -> None:
    mlflow.set_tracking_uri(tracking_uri)
    a = torch.randn(64, 64)
    with mlflow.start_run() as run:
        profiled = nm.profile(
            schedule=nm.Schedule(warmup=1, active=5), backend="cpu", local_dir=tempfile.mkdtemp()
        )(lambda: a @ a)
        for _ in range(6):
            profiled()
        profiled.profiler.wait(60)
    client = MlflowClient()
    (window,) = [x.path for x in client.list_artifacts(run.info.run_id, "profile") if x.is_dir]
    local = client.download_artifacts(run.info.run_id, f"{window}/steps.jsonl", tempfile.mkdtemp())
    heads, _ = read_step_samples(Path(local).read_text())
    assert len(heads) == 5
    for head in heads:
        assert isinstance(head["cpu_wait_us"], float) and head["cpu_wait_us"] >= 0
        assert isinstance(head["involuntary_switches"], int)
        assert isinstance(head["disturbed"], bool)
    mlflow.set_tracking_uri(None)


def _run_with_steps(name: str, cpu: list[float], disturbed: list[bool], ops: bool = False) -> str:
    """A run with one window whose steps.jsonl has these steps (the rest as a window logs);
    ``ops``: with one op (``aten::mul``, half of each step, 2 calls) and its summary.json."""
    folder = Path(tempfile.mkdtemp()) / "step_000000-000019"
    folder.mkdir()
    rows = [
        {"step": i, "wall_time_us": v, "cpu_time_us": v, "device_time_us": None,
         "op_calls": 1, "cpu_wait_us": 900.0 if d else 0.0,
         "involuntary_switches": 2 if d else 0, "disturbed": d}
        for i, (v, d) in enumerate(zip(cpu, disturbed, strict=True))
    ]  # fmt: skip
    if ops:
        rows += [
            {"step": i, "op": "aten::mul", "key": "aten::mul", "self_cpu_us": v / 2,
             "self_device_us": None, "calls": 2}
            for i, v in enumerate(cpu)
        ]  # fmt: skip
        mean = sum(cpu) / len(cpu)
        summary = build_summary([RawOp("aten::mul", 2 * len(cpu), mean * len(cpu) / 2,
                                       mean * len(cpu) / 2)], len(cpu), len(cpu),
                                mean * len(cpu))  # fmt: skip
        (folder / "summary.json").write_text(json.dumps({"summary": summary.to_dict()}))
    (folder / "steps.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_metrics(
            {"profile/op_calls": 1.0, "profile/cpu_time_us": sum(cpu) / len(cpu),
             "profile/wall_time_us": sum(cpu) / len(cpu)}
        )  # fmt: skip
        mlflow.log_artifacts(str(folder), f"profile/{folder.name}")
    return run.info.run_id


def _compare(*args: str, fmt: str = "json") -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["compare", *args, "--format", fmt])
    return json.loads(out.getvalue()) if fmt == "json" else {"text": out.getvalue()}


def test_compare_leaves_disturbed_steps_out_and_says_when_they_are_most(tracking_uri) -> None:
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("disturbed")
    steady = [100.0 + (i % 3) for i in range(20)]
    base = _run_with_steps("base", steady, [False] * 20)
    # 1.3x the work; 4 steps 30x slower, disturbed: left out, the verdict stands
    some = [130.0 + (i % 3) if i % 5 else 3900.0 for i in range(20)]
    cand = _run_with_steps("slower", some, [i % 5 == 0 for i in range(20)])
    data = _compare(cand, "--baseline", base)
    e = data["estimates"][cand]["cpu_time_us"]
    assert e["verdict"] == "regression" and e["ratio"] == pytest.approx(1.3, rel=0.02)
    assert "4 of 20 steps disturbed by other processes" in e["reason"]
    assert e["steps"] == [20, 16]
    assert data["runs"][1]["steps_disturbed"] == 4 and data["runs"][1]["steps_read"] == 20

    # most steps disturbed: no verdict, and the reason names them
    most = _run_with_steps("busy", [130.0] * 20, [i % 10 != 0 for i in range(20)])
    data = _compare(most, "--baseline", base)
    e = data["estimates"][most]["cpu_time_us"]
    assert e["verdict"] == "insufficient data"
    assert e["reason"] == "18 of 20 steps disturbed by other processes (busy)"
    assert data["outcome"]["fastest"] is None
    assert (
        data["outcome"]["result"] == "no winner: insufficient data (busy: 18 of 20 steps disturbed)"
    )
    mlflow.set_tracking_uri(None)


def test_the_gate_does_not_pass_a_side_that_other_processes_disturbed(tracking_uri, capsys) -> None:
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("disturbed-gate")
    base = _run_with_steps("base", [100.0 + (i % 3) for i in range(20)], [False] * 20)
    # a real 1.5x regression, but 12 of 20 steps disturbed: the gate cannot decide (exit 3)
    cand = _run_with_steps("slow", [150.0] * 20, [i % 5 != 0 for i in range(20)])
    code = main(["compare", cand, "--baseline", base, "--fail-above", "10"])
    assert code == 3
    err = capsys.readouterr().err
    assert "16 of 20 steps disturbed by other processes" in err
    assert main(["compare", cand, "--baseline", base, "--fail-above", "10",
                 "--allow-insufficient"]) == 0  # fmt: skip
    mlflow.set_tracking_uri(None)


def test_a_variant_with_every_step_disturbed_shows_no_value_and_no_winner(tracking_uri) -> None:
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("disturbed-all")
    steady = _run_with_steps("naive", [100.0 + (i % 3) for i in range(20)], [False] * 20)
    fused = _run_with_steps("rms_norm", [80.0 + (i % 3) for i in range(20)], [False] * 20)
    unseen = _run_with_steps("compiled", [500.0] * 20, [True] * 20)  # logged mean: 500
    data = _compare(steady, fused, unseen)
    assert "cpu_time_us" not in data["values"][unseen]  # not the logged 500 as a statistic
    assert data["outcome"]["fastest"] is None
    assert data["outcome"]["result"] == (
        "no winner: insufficient data (compiled: 20 of 20 steps disturbed)"
    )
    assert data["estimates"][fused]["cpu_time_us"]["verdict"] == "improvement"
    mlflow.set_tracking_uri(None)


def test_an_op_of_a_run_with_every_step_disturbed_is_there_untimed(tracking_uri, tmp_path) -> None:
    """Every step of B disturbed (a loaded 2-core machine): its ops are not "gone", their
    timing is insufficient data; counts still show; B's run is counted."""
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("disturbed-every-op")
    a = _run_with_steps("A", [100.0 + (i % 3) for i in range(20)], [False] * 20, ops=True)
    b = _run_with_steps("B", [130.0] * 20, [True] * 20, ops=True)

    data = _compare(b, "--baseline", a)
    (op,) = data["ops"]
    assert op["op"] == "aten::mul" and op["status"][b] == ""  # in both runs, not "gone"
    assert op["values"][b] is None  # no undisturbed step to time
    e = op["estimate"][b]
    assert e["verdict"] == "insufficient data"
    assert e["reason"] == "20 of 20 steps disturbed by other processes (B)"
    assert data["values"][b]["op_calls"] == 1.0  # a count: load cannot change it
    assert data["estimates"][b]["cpu_time_us"]["runs"] == [1, 1]
    assert data["outcome"]["result"] == "no winner: insufficient data (B: 20 of 20 steps disturbed)"
    statistic = data["estimates"][b]["cpu_time_us"]
    assert statistic["verdict"] == "insufficient data"

    text = _compare(b, "--baseline", a, fmt="table")["text"]
    assert "[gone]" not in text and "only in the baseline" not in text
    assert "- ()" not in text
    (mul,) = [line for line in text.splitlines() if line.startswith("aten::mul ")]
    assert "every step disturbed" in mul
    (how_sure,) = [line for line in text.splitlines() if line.startswith("op aten::mul ")]
    assert "insufficient data" in how_sure
    calls = next(line for line in text.splitlines() if line.startswith("op_calls "))
    assert calls.split()[1:] == ["1", "1", "(+0.0%)"]
    cpu = next(line for line in text.splitlines() if line.startswith("cpu_time_us "))
    assert cpu.split()[1:] == ["100.0", "-", "[every", "step", "disturbed]"]

    page = tmp_path / "c.html"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["compare", b, "--baseline", a, "--html", str(page)])
    html = page.read_text()
    assert "[gone]" not in html and "only in the baseline" not in html
    assert "every step disturbed" in html

    # the gate cannot decide (exit 3), and says why: not "profile more steps"
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["compare", b, "--baseline", a, "--fail-above", "10"]) == 3
    advice = err.getvalue().splitlines()[-1]
    assert "Schedule(active=20" not in advice
    assert "every step of B was disturbed by other processes" in advice
    mlflow.set_tracking_uri(None)
