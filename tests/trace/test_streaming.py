"""The trace engine's streaming pass: the same answers as the exact buffered pass, in any
file layout, in memory that does not grow with the file; and the reader's chunked decode."""

from __future__ import annotations

import gzip
import json
import logging
import random
import subprocess
import sys
import zlib
from collections import defaultdict, deque
from pathlib import Path

import pytest

from neuron_mlflow.trace import links as trace_links
from neuron_mlflow.trace import reader as trace_reader
from neuron_mlflow.trace import replay as trace_replay
from neuron_mlflow.trace.buffered import buffered_pass
from neuron_mlflow.trace.reader import TraceStream
from neuron_mlflow.trace.summarize import TraceResult, _result, summarize_trace
from tests.helpers import ROOT

REAL = sorted((ROOT / "tests" / "data" / "traces").glob("*.json.gz"))
FALLBACK = "reading it again with the buffered pass"


def buffered(path: Path) -> TraceResult:
    stream = TraceStream(path, typed=True)
    return _result(buffered_pass(stream), stream.metadata, None)


def assert_same(ours: TraceResult, exact: TraceResult) -> None:
    a, b = ours.summary, exact.summary
    assert (a.steps, a.op_calls, a.device_label) == (b.steps, b.op_calls, b.device_label)
    assert a.wall_time_us == pytest.approx(b.wall_time_us)
    assert a.cpu_time_us == pytest.approx(b.cpu_time_us)
    assert (a.device_time_us is None) == (b.device_time_us is None)
    if a.device_time_us is not None:
        assert a.device_time_us == pytest.approx(b.device_time_us)
    assert {op.name for op in a.ops} == {op.name for op in b.ops}
    exact_ops = {op.name: op for op in b.ops}
    for op in a.ops:
        other = exact_ops[op.name]
        assert op.calls == other.calls, op.name
        assert op.self_cpu_us == pytest.approx(other.self_cpu_us, abs=1e-6), op.name
        assert op.cpu_total_us == pytest.approx(other.cpu_total_us, abs=1e-6), op.name
        assert op.self_device_us == pytest.approx(other.self_device_us, abs=1e-6), op.name
    assert ours.kernels == pytest.approx(exact.kernels)
    assert ours.device_events == exact.device_events
    assert ours.unattributed_device_events == exact.unattributed_device_events
    assert (ours.device_busy_pct is None) == (exact.device_busy_pct is None)
    if ours.device_busy_pct is not None:
        assert ours.device_busy_pct == pytest.approx(exact.device_busy_pct)
    assert ours.rank == exact.rank


def rewrite(path: Path, out: Path, reorder) -> Path:
    whole = json.loads(gzip.decompress(path.read_bytes()))
    whole["traceEvents"] = reorder(whole["traceEvents"])
    out.write_text(json.dumps(whole, indent=1))  # pretty-printed, as Kineto writes them
    return out


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_streaming_agrees_with_the_exact_pass_without_falling_back(path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    assert_same(summarize_trace(path), buffered(path))
    assert FALLBACK not in caplog.text


def cpu_first(events: list[dict]) -> list[dict]:
    """Every CPU operator first, then runtime calls and device events (as Kineto writes)."""
    return sorted(events, key=lambda e: e.get("cat") not in ("cpu_op", "user_annotation"))


def device_first(events: list[dict]) -> list[dict]:
    """Every device event before any launch."""
    return sorted(events, key=lambda e: e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"))


def runtime_first(events: list[dict]) -> list[dict]:
    """Every runtime call before the operators around it."""
    return sorted(events, key=lambda e: e.get("cat") not in ("cuda_runtime", "cuda_driver"))


@pytest.mark.parametrize(
    "layout", [cpu_first, device_first, runtime_first], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_other_layouts_stream_to_the_same_numbers(path, layout, tmp_path, caplog) -> None:
    rewritten = rewrite(path, tmp_path / f"{layout.__name__}.json", layout)
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    assert_same(summarize_trace(rewritten), summarize_trace(path))
    assert FALLBACK not in caplog.text


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_a_shuffled_file_falls_back_to_the_exact_pass(path, tmp_path, caplog) -> None:
    def shuffled(events: list[dict]) -> list[dict]:
        # Events that start together on one thread keep their order: for identical
        # intervals, file order is the only record of which one is the parent.
        def together(event: dict) -> tuple:
            return (event.get("pid"), event.get("tid"), event.get("ts"), event.get("cat"))

        order = events[:]
        random.Random(7).shuffle(order)
        queues: dict[tuple, deque] = defaultdict(deque)
        for event in events:
            queues[together(event)].append(event)
        return [queues[together(event)].popleft() for event in order]

    layout = rewrite(path, tmp_path / "shuffled.json", shuffled)
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    assert_same(summarize_trace(layout), summarize_trace(path))
    assert FALLBACK in caplog.text and "shuffled.json" in caplog.text


@pytest.fixture
def tiny_windows(monkeypatch):
    """Windows and blocks small enough that the real traces spill and reorder."""
    monkeypatch.setattr(trace_replay, "BLOCK_OPS", 16)
    monkeypatch.setattr(trace_replay, "LAUNCH_WINDOW", 8)
    monkeypatch.setattr(trace_links, "REORDER_EVENTS", 16)
    monkeypatch.setattr(trace_links, "LAUNCHES_IN_MEMORY", 8)
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 512)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_spilling_and_small_windows_change_nothing(path, tmp_path, tiny_windows, caplog):
    exact = buffered(path)
    caplog.set_level(logging.INFO, logger="neuron_mlflow")
    assert_same(summarize_trace(path), exact)
    assert_same(summarize_trace(rewrite(path, tmp_path / "c.json", cpu_first)), exact)
    if "sampled" not in path.name:  # its few late device events are beyond a 16-event window
        assert FALLBACK not in caplog.text


def synthetic_trace(path: Path, steps: int) -> Path:
    """A Kineto-like trace: per step 20 ops (each with a nested op) launching 20 kernels."""
    events = []
    for step in range(steps):
        t = step * 1000.0
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
             "tid": 1, "ts": t, "dur": 999.0}
        )  # fmt: skip
        for i in range(20):
            corr, start = step * 100 + i, t + 1 + 40 * i
            events += [
                {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 1, "tid": 1,
                 "ts": start, "dur": 30.0, "args": {"External id": corr}},
                {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1,
                 "ts": start + 1, "dur": 2.0},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                 "tid": 1, "ts": start + 5, "dur": 4.0, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": f"kernel{i % 5}", "pid": 0, "tid": 7,
                 "ts": start + 10, "dur": 15.0, "args": {"correlation": corr}},
            ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))
    return path


PEAK = """
import json, sys, tracemalloc
from pathlib import Path
from neuron_mlflow.trace import links, reader, replay
from neuron_mlflow.trace.summarize import summarize_trace

replay.BLOCK_OPS, replay.LAUNCH_WINDOW = 256, 64  # small windows: it spills and replays
links.REORDER_EVENTS, links.LAUNCHES_IN_MEMORY = 64, 256
reader.CHUNK_CHARS = 1 << 14
summarize_trace(Path(sys.argv[1]))  # what a first call sets up (caches): not counted
tracemalloc.start()
result = summarize_trace(Path(sys.argv[2]))
peak, summary = tracemalloc.get_traced_memory()[1], result.summary
print(json.dumps([peak, summary.steps, result.unattributed_device_events,
                  summary.ops[0].self_device_us, result.device_busy_pct]))
"""


def test_memory_does_not_grow_with_the_file(tmp_path) -> None:
    # Each peak in a fresh interpreter, where it is the same at every run (250 and 303 KB).
    # In the test process it depends on what earlier tests left (free lists that serve
    # allocations unseen, other threads: tracemalloc counts them all) by more than the bar's
    # margin: 250 and 334 KB after tests/trace/test_rules.py, 376 KB for 500 in the suite.
    small = synthetic_trace(tmp_path / "t50.json", 50)
    peaks = {}
    for steps in (50, 500):
        path = small if steps == 50 else synthetic_trace(tmp_path / f"t{steps}.json", steps)
        argv = [sys.executable, "-c", PEAK, str(small), str(path)]
        out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        peaks[steps], counted, unattributed, self_device_us, busy_pct = json.loads(out.stdout)
        assert (counted, unattributed) == (steps, 0)
        assert self_device_us == pytest.approx(4 * 15.0)
        busy, span = steps * 20 * 15.0, (steps - 1) * 1000.0 + 786 - 11  # first kernel to last
        assert busy_pct == pytest.approx(100 * busy / span)
    assert peaks[500] < 1.3 * peaks[50], peaks  # a file 10x the size: about the same peak


def test_chunked_decode_reads_every_event_across_chunk_edges(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 64)
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "braces }, { in a name", "ts": 1, "dur": 2},
        {"ph": "X", "name": "nested", "args": {"shapes": [{"a": 1}, {"b": 2}]}, "ts": 3},
        {"ph": "X", "name": "ünïcode", "ts": "5.5", "dur": "1"},  # times as strings
        {"ph": "X", "name": "bad time", "ts": "soon"},
        {"ph": "M", "name": "process_name", "args": {"name": "p"}},
        7,  # not an event at all
    ] * 20
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events, "after": {"k": [1, 2]}}, indent=2))
    assert list(TraceStream(path)) == [e for e in events if isinstance(e, dict)]
    stream = TraceStream(path, typed=True)
    typed = list(stream)
    assert [e.name for e in typed] == [
        e["name"] for e in events if isinstance(e, dict) and e.get("ts") != "soon"
    ]
    assert {(e.name, e.ts, e.dur) for e in typed} >= {("ünïcode", 5.5, 1.0)}
    assert stream.metadata == {"after": {"k": [1, 2]}}


def test_summarize_does_not_import_the_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from neuron_mlflow.cli import main\n"
        f"assert main(['summarize', {str(REAL[0])!r}]) == 0\n"
        "print(sorted(m for m in ('torch', 'mlflow', 'pydantic', 'numpy', 'lightning')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "| Name | Calls |" in out.stdout


@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_a_malformed_event_is_reported_at_its_byte_offset(tmp_path, monkeypatch, chunk) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", chunk)
    good = [{"ph": "X", "name": f"ünïcödé op {i} ✓", "ts": i, "dur": 1} for i in range(50)]
    head = json.dumps({"traceEvents": good})[:-2] + ", "  # drop the closing ']}'
    bad = '{"ph": "X", "name": "broken", "ts": 1,, "dur": 2}]}'
    path = tmp_path / "bad.json"
    path.write_bytes((head + bad).encode())
    at = len(head.encode()) + bad.index(",,") + 1  # the second comma
    with pytest.raises(trace_reader.TraceFormatError, match=rf"bad\.json: .* byte offset {at} "):
        list(TraceStream(path, typed=True))


def _cut_gzip(data: bytes) -> bytes:
    """A gzip stream that holds exactly ``data`` and then breaks off (no end marker)."""
    packer = zlib.compressobj(wbits=31)
    return packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH)


@pytest.mark.parametrize("chunk", [64, 1 << 20])
@pytest.mark.parametrize("typed", [False, True])
def test_a_cut_gzip_stream_is_truncated_at_the_offset_its_data_reaches(
    tmp_path, monkeypatch, chunk, typed
) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", chunk)
    events = [{"ph": "X", "name": f"op {i}", "ts": i, "dur": 1} for i in range(200)]
    text = json.dumps({"traceEvents": events}).encode()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(_cut_gzip(text[:3000]))
    stream = TraceStream(path, typed=typed)
    seen = []
    with pytest.raises(
        trace_reader.TraceFormatError,
        match=r"cut\.json\.gz: truncated file: .* at byte offset 3000 .*incomplete",
    ):
        seen.extend(stream)
    assert 0 < len(seen) < len(events)  # the events before the cut were read


def test_a_gzip_stream_cut_inside_a_character_is_truncated_not_undecodable(tmp_path) -> None:
    event = {"ph": "X", "name": "ünïcödé", "ts": 1}
    text = json.dumps({"traceEvents": [event]}, ensure_ascii=False).encode()
    at = text.index("ï".encode()) + 1  # between the two bytes of 'ï'
    path = tmp_path / "cut.json.gz"
    path.write_bytes(_cut_gzip(text[:at]))
    with pytest.raises(
        trace_reader.TraceFormatError, match=rf"truncated file: .* byte offset {at - 1} "
    ):
        list(TraceStream(path))


def test_a_gzip_file_cut_in_its_header_is_truncated_at_offset_0(tmp_path) -> None:
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}')[:5])
    with pytest.raises(trace_reader.TraceFormatError, match=r"truncated file: .* offset 0 "):
        list(TraceStream(path))


def test_damaged_gzip_data_is_unreadable_not_empty(tmp_path) -> None:
    data = bytearray(gzip.compress(json.dumps({"traceEvents": []}).encode() * 50))
    data[20:40] = b"\xff" * 20
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(
        trace_reader.TraceFormatError, match=r"unreadable data \((error|OSError|BadGzipFile)"
    ):
        list(TraceStream(path))
