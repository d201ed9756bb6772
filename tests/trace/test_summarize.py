"""The trace engine: streaming reader and per-op summaries from trace files."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import zlib
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from neuron_mlflow.cli import main
from neuron_mlflow.trace.reader import TraceFormatError, TraceStream
from neuron_mlflow.trace.summarize import summarize_trace
from tests.helpers import ROOT, inputs, rmsnorm_naive

REAL = sorted((ROOT / "tests" / "data" / "traces").glob("*.json.gz"))


def test_real_traces_are_present() -> None:
    assert len(REAL) == 5


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_streaming_reads_every_event_and_the_metadata(path: Path) -> None:
    whole = json.loads(gzip.decompress(path.read_bytes()))
    stream = TraceStream(path)
    events = list(stream)
    assert len(events) == len(whole["traceEvents"])
    assert events[0] == whole["traceEvents"][0] and events[-1] == whole["traceEvents"][-1]
    assert stream.metadata == {k: v for k, v in whole.items() if k != "traceEvents"}


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_traces_give_plausible_summaries(path: Path) -> None:
    result = summarize_trace(path)
    s = result.summary
    assert s.cpu_time_us > 0 and s.op_calls > 0 and s.wall_time_us > 0
    assert abs(sum(op.cpu_pct for op in s.ops) - 100.0) < 1e-6
    attributed = result.device_events - result.unattributed_device_events
    assert 0 <= attributed <= result.device_events
    if s.device_time_us is not None:
        assert s.device_label == "CUDA"
        assert s.device_time_us == pytest.approx(sum(result.kernels.values()) / s.steps)
        assert 0 < result.device_busy_pct <= 100


def test_real_trace_facts() -> None:
    by_name = {p.name: summarize_trace(p) for p in REAL}
    assert by_name["cpu_only_rank34.json.gz"].rank == 34
    assert by_name["cpu_only_rank34.json.gz"].summary.device_time_us is None
    rocm = by_name["rocm_mi250_minitoy_train.json.gz"]
    assert rocm.summary.steps == 2 and rocm.unattributed_device_events == 0
    assert rocm.device_events == 16
    sampled = by_name["cuda_sampled_rank0.json.gz"]
    assert sampled.unattributed_device_events == 0 and sampled.device_events == 1204
    counters = by_name["cuda_cupti_counters.json.gz"]
    assert counters.device_events == counters.unattributed_device_events == 77


def test_agrees_with_key_averages_on_a_live_cpu_profile(tmp_path, caplog) -> None:
    x, w = inputs(64)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    seen = {}

    def ready(prof) -> None:
        seen["avg"] = [a for a in prof.key_averages() if not a.key.startswith("ProfilerStep")]
        seen["top"] = sum(
            1
            for e in prof.events()
            if not e.name.startswith("ProfilerStep")
            and (e.cpu_parent is None or e.cpu_parent.name.startswith("ProfilerStep"))
        )
        prof.export_chrome_trace(str(tmp_path / "live.json"))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(4):
            with record_function("forward"):
                model(rmsnorm_naive(x, w)).sum().backward()
            prof.step()
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    result = summarize_trace(tmp_path / "live.json")
    assert "buffered pass" not in caplog.text  # torch writes what the streaming pass reads
    total = sum(row.self_cpu_time_total for row in seen["avg"])
    ours = {op.name: op for op in result.summary.ops}
    checked = 0
    for row in seen["avg"]:
        if row.self_cpu_time_total < 0.01 * total:
            continue
        checked += 1
        per_step = row.self_cpu_time_total / 3
        assert ours[row.key].self_cpu_us == pytest.approx(per_step, rel=0.02), row.key
    assert checked >= 2  # which ops pass 1% varies with the machine's load
    assert result.summary.steps == 3
    assert result.summary.op_calls == seen["top"] / 3


def test_truncated_file_names_the_file_and_offset(tmp_path, capsys) -> None:
    text = gzip.decompress(REAL[-1].read_bytes()).decode()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json: .* at byte offset \d+"):
        summarize_trace(cut)
    assert main(["summarize", str(cut)]) == 2
    assert "cut.json" in capsys.readouterr().err


def _live_trace(path: Path) -> None:
    """A CPU profile of a small model, exported by torch as a Chrome trace at ``path``."""
    x, w = inputs(64)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            model(rmsnorm_naive(x, w)).sum().backward()
    prof.export_chrome_trace(str(path))


def test_a_cut_gzip_trace_is_reported_truncated_where_its_data_ends(tmp_path, capsys) -> None:
    # The newcomer's `head -c 3000 trace.json.gz > cut.json.gz`: the cut stream decompresses
    # to thousands of bytes before it breaks off; it was reported as an empty file at 0.
    _live_trace(tmp_path / "live.json")
    whole = gzip.compress((tmp_path / "live.json").read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[:3000])
    reached = len(zlib.decompressobj(wbits=31).decompress(cut.read_bytes()))
    assert reached > 3000
    want = rf"cut\.json\.gz: truncated file: .*gzip.* ends early.* at byte offset {reached} "
    with pytest.raises(TraceFormatError, match=want):
        summarize_trace(cut)
    assert main(["summarize", str(cut)]) == 2
    err = capsys.readouterr().err
    assert re.search(want, err), err
    assert "empty file" not in err


@pytest.mark.parametrize("name", ["empty.json", "empty.json.gz"])
def test_an_empty_file_is_still_an_empty_file(tmp_path, name) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    with pytest.raises(TraceFormatError, match=r"empty file at byte offset 0 "):
        summarize_trace(path)


def test_tolerates_odd_but_valid_events(tmp_path) -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 4},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mul",
            "pid": 1,
            "tid": 1,
            "ts": 10.5,
            "dur": 2.25,
        },
        {"ph": "s", "cat": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 11},
        {"ph": "C", "name": "counter", "pid": 1, "ts": 12, "args": {"v": 1}},
        {"ph": "i", "name": "instant", "pid": 1, "ts": 13},
        {"ph": "X", "cat": "cpu_op", "name": "no-args", "pid": 1, "tid": 2, "ts": 20, "dur": 1},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(events))  # a bare array of events is a valid trace too
    s = summarize_trace(path).summary
    assert {op.name for op in s.ops} == {"aten::add", "aten::mul", "no-args"}
    assert s.op_calls == 3 and s.device_time_us is None


def test_summarize_command_prints_the_table(capsys) -> None:
    path = next(p for p in REAL if p.name.startswith("rocm"))
    assert main(["summarize", str(path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "| Name | Calls | Self CPU | Self CUDA | CUDA % |" in out
    assert "Device events: 16, unattributed: 0" in out and "Device busy:" in out
    assert main(["summarize", "/nowhere.json"]) == 2


def test_ingest_a_folder_of_ranks(tmp_path, capsys) -> None:
    import shutil

    from mlflow import MlflowClient

    from tests.helpers import artifact_files

    folder = tmp_path / "traces"
    folder.mkdir()
    for path in REAL:
        shutil.copy(path, folder / path.name)
    (folder / "notes.json").write_text('{"not": "a trace"}')
    assert main(["ingest", str(folder), "--experiment", "ingested"]) == 0
    out = capsys.readouterr().out
    run_id = out.strip().splitlines()[-1].split(" into run ")[1].split()[0]
    run = MlflowClient().get_run(run_id)
    assert MlflowClient().get_experiment(run.info.experiment_id).name == "ingested"
    metrics = run.data.metrics
    # rank 34 from its distributedInfo; rank 0 is the AlexNet trace (first file saying 0)
    alexnet = summarize_trace(folder / "cuda_alexnet_benchmark.json.gz").summary
    assert metrics["profile/op_calls"] == alexnet.op_calls
    assert metrics["profile/device_time_us"] == pytest.approx(alexnet.device_time_us)
    assert 0 < metrics["profile/device_busy_pct"] <= 100
    assert metrics["profile/rank/34/cpu_time_us"] > 0
    assert metrics["profile/rank/0/device_time_us"] == pytest.approx(alexnet.device_time_us)
    assert {k.split("/")[2] for k in metrics if k.startswith("profile/rank/")} == {
        "0",
        "1",
        "2",
        "3",
        "34",
    }
    assert "unattributed" in out
    files = artifact_files(run_id)
    window = "profile/step_000000-000000"
    assert f"{window}/summary.json" in files and f"{window}/ops.csv" in files
    local = MlflowClient().download_artifacts(
        run_id, f"{window}/traces/rank_34/cpu_only_rank34.json.gz", str(tmp_path / "d")
    )
    assert Path(local).read_bytes() == (folder / "cpu_only_rank34.json.gz").read_bytes()
    assert not any("notes.json" in f for f in files)


def test_ingest_into_an_existing_run_with_a_prefix(tmp_path, capsys) -> None:
    from mlflow import MlflowClient

    run_id = MlflowClient().create_run("0").info.run_id
    rocm = next(p for p in REAL if p.name.startswith("rocm"))
    assert main(["ingest", str(rocm), "--run-id", run_id, "--prefix", "ingest/rocm"]) == 0
    metrics = MlflowClient().get_run(run_id).data.metrics
    assert metrics["ingest/rocm/steps"] == 2
    assert "ingest/rocm/op/aten.addmm/self_device_us" in metrics
    capsys.readouterr()
    assert main(["ingest", str(rocm), "--run-id", "0" * 32]) == 2
    assert "was not found" in capsys.readouterr().err
    assert main(["ingest", str(tmp_path / "missing.json")]) == 2
    assert main(["ingest", str(rocm), "--prefix", "bad prefix"]) == 2
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "name": "a"}, {"ph": ')
    assert main(["ingest", str(cut)]) == 2
    assert "cut.json" in capsys.readouterr().err


def test_ingest_with_the_server_down_keeps_the_window_for_sync(tmp_path, monkeypatch, capsys):
    from tests.conftest import free_port
    from tests.helpers import metrics

    rocm = next(p for p in REAL if p.name.startswith("rocm"))
    good_uri = os.environ["MLFLOW_TRACKING_URI"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    assert main(["ingest", str(rocm), "--local-dir", str(tmp_path / "spool")]) == 1
    assert "(pending)" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", good_uri)
    assert main(["sync", "--local-dir", str(tmp_path / "spool")]) == 0
    run_id = capsys.readouterr().out.split("-> run ")[1].split()[0]
    assert metrics(run_id)["profile/steps"] == 2
