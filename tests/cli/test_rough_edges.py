"""The rough edges of the command line: help text, a file that is not a trace, bad options,
and `MLproject`'s defaults against the recipes' own. Every error is one line on stderr naming
the bad value, with exit code 2 (``EXIT_USAGE``) and no traceback."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from neuron_mlflow.cli import main
from neuron_mlflow.cli.app import EXIT_FAILURE, EXIT_USAGE
from tests.conftest import free_port
from tests.helpers import ROOT

VERBS = ("sync", "compare", "download", "summarize", "ingest", "capture")


@pytest.mark.parametrize("verb", VERBS)
def test_help_shows_percent_signs_once(verb, capsys) -> None:
    assert main([verb, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "%%" not in text
    if verb == "compare":
        assert "its 95% interval" in text


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # no table of zeros, nothing half-printed
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


def _random_bytes(n: int = 4096) -> bytes:
    rng = random.Random(31)
    return bytes(rng.randrange(256) for _ in range(n))


NOT_TRACES = {
    "random.json": (_random_bytes(), "is not a trace: its bytes are not text"),
    "random.bin": (_random_bytes(), "is not a trace: its bytes are not text"),
    "random.json.gz": (_random_bytes(), "is not a trace: named .gz but not gzip data"),
    "words.json": (b"hello, world\n", "is not a trace: it starts with 'hello, world'"),
    "empty.json": (b"", "is not a trace: the file is empty"),
    "plain.json.gz": (b'{"traceEvents": []}', "is named .gz but holds plain JSON text"),
    "packed.json": (gzip.compress(b'{"traceEvents": []}'), "is gzip-compressed but not named"),
}


@pytest.mark.parametrize("name", ["random.json", "words.json", "empty.json"])
def test_ingest_says_a_file_is_not_a_trace(name, tmp_path, capsys) -> None:
    content, expected = NOT_TRACES[name]
    path = tmp_path / name
    path.write_bytes(content)
    spool = tmp_path / "spool"
    err = _one_line_error(capsys, ["ingest", str(path), "--local-dir", str(spool)])
    assert err.startswith(f"neuron-mlflow ingest: {path} {expected}"), err
    assert not spool.exists()  # nothing spooled, no run made


@pytest.mark.parametrize("name", sorted(NOT_TRACES))
def test_summarize_says_a_file_is_not_a_trace(name, tmp_path, capsys) -> None:
    data, expected = NOT_TRACES[name]
    path = tmp_path / name
    path.write_bytes(data)
    err = _one_line_error(capsys, ["summarize", str(path)])
    assert err.startswith(f"neuron-mlflow summarize: {path} ")
    assert expected in err
    assert "empty file at byte offset" not in err


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        ({"traceEvents": []}, "holds no trace events (its traceEvents is empty or missing)"),
        ({"schemaVersion": 1, "deviceProperties": []}, "holds no trace events"),
        ([], "holds no trace events"),
        (
            {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}}]},
            "holds 1 trace event but no operator or device event (an empty profiler window?)",
        ),
    ],
    ids=["empty-list", "no-traceEvents", "bare-empty-array", "metadata-only"],
)
def test_summarize_of_a_trace_without_events_says_so(trace, expected, tmp_path, capsys) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    err = _one_line_error(capsys, ["summarize", str(path)])
    assert f"{path} {expected}" in err and err.endswith(": nothing to summarize\n")


def test_summarize_of_a_directory_says_it_is_one(tmp_path, capsys) -> None:
    err = _one_line_error(capsys, ["summarize", str(tmp_path)])
    assert f"{tmp_path} is a directory, not a trace file" in err
    assert "neuron-mlflow ingest DIR" in err
    err = _one_line_error(capsys, ["summarize", str(tmp_path / "missing.json")])
    assert f"no such file: {tmp_path / 'missing.json'}" in err


def test_summarize_top_must_be_positive(capsys) -> None:
    trace = ROOT / "tests" / "data" / "traces" / "cpu_only_rank34.json.gz"
    err = _one_line_error(capsys, ["summarize", str(trace), "--top", "0"])
    assert "--top 0: give N >= 1" in err


def test_the_console_command_prints_one_line_and_exits_2(tmp_path) -> None:
    """As a user sees it: the installed entry point, a real process, stderr only."""
    path = tmp_path / "random.json"
    path.write_bytes(_random_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    for target, expected in ((path, "is not a trace"), (tmp_path, "is a directory")):
        result = subprocess.run(
            [sys.executable, "-m", "neuron_mlflow.cli", "summarize", str(target)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--top", "0"], "--top 0: give N >= 1"),
        (["--fail-above", "-5"], "--fail-above -5: give PCT >= 0"),
        (["--experiment", "e", "--last", "0"], "--last 0: give K >= 1"),
        (["--experiment", "e"], "--experiment without its partner"),
        (["--last", "2"], "--last without its partner"),
        (["--split-by", "commit"], "--split-by commit: goes with --experiment NAME --last K"),
    ],
)
def test_compare_names_the_bad_option(options, expected, capsys) -> None:
    run = "0123456789abcdef0123456789abcdef"
    err = _one_line_error(capsys, ["compare", run, run, *options])
    assert err.startswith(f"neuron-mlflow compare: {expected}")


def test_compare_of_an_unknown_experiment_exits_2(capsys) -> None:
    err = _one_line_error(capsys, ["compare", "--experiment", "no-such-experiment", "--last", "2"])
    assert "experiment 'no-such-experiment' was not found" in err


def _mlproject() -> dict:
    return yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]


@pytest.mark.parametrize(("entry", "script"), [("rmsnorm", "rmsnorm"), ("train", "train")])
def test_mlproject_defaults_are_the_recipes_defaults(entry, script) -> None:
    """Every recipe option with a default is an entry-point parameter with the same default,
    passed on the command line (`--experiment` is `mlflow run --experiment-name`'s)."""
    import importlib

    recipe = importlib.import_module(f"recipes.{script}")
    defaults = vars(recipe.parse_args([]))
    point = _mlproject()[entry]
    params = {name: spec["default"] for name, spec in point["parameters"].items()}
    wanted = {
        name: ",".join(value) if isinstance(value, list) else value
        for name, value in defaults.items()
        if name != "experiment" and value is not None
    }
    assert params == wanted
    for name in params:
        assert f"--{name.replace('_', '-')} {{{name}}}" in point["command"]


def test_summarize_is_still_fine_with_a_real_trace(capsys) -> None:
    trace = Path(ROOT / "tests" / "data" / "traces" / "cpu_only_rank34.json.gz")
    assert main(["summarize", str(trace), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "| Name |" in out


# --- a tracking server that is down or failing is a failure (exit 1), not an unknown run ---

RUN_VERBS = {
    "compare": ["compare", "abc", "def"],
    "download": ["download", "abc", "--dest", "d"],
    "capture": ["capture", "abc"],
}


def _one_line_failure(capsys, argv: list[str], within_s: float = 20.0) -> str:
    started = time.monotonic()
    assert main(argv) == EXIT_FAILURE
    assert time.monotonic() - started < within_s  # not MLflow's minutes of HTTP retries
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize("verb", sorted(RUN_VERBS))
def test_an_unreachable_server_is_one_line_and_exit_1_at_once(verb, monkeypatch, capsys) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    err = _one_line_failure(capsys, RUN_VERBS[verb])
    assert err.startswith(
        f"neuron-mlflow {verb}: cannot connect to the MLflow tracking server at {uri} ("
    ), err
    assert "not found" not in err and "unknown run" not in err


class _BrokenBackend(BaseHTTPRequestHandler):
    """A server whose /health answers but whose every MLflow API call fails (HTTP 500), as a
    tracking server in front of a broken database does."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            body, status = b"OK", 200
        else:
            message = {"error_code": "INTERNAL_ERROR", "message": "the database is locked"}
            body, status = json.dumps(message).encode(), 500
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def broken_backend() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenBackend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("verb", sorted(RUN_VERBS))
def test_a_failing_server_is_a_failure_not_an_unknown_run(
    verb, broken_backend, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", broken_backend)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the test's time, not the point
    err = _one_line_failure(capsys, RUN_VERBS[verb])
    assert err.startswith(f"neuron-mlflow {verb}: MLflow failed at {broken_backend}: "), err
    assert "not found" not in err and "unknown run" not in err


@pytest.mark.parametrize(
    ("verb", "expected"),
    [
        ("compare", "neuron-mlflow compare: run 'abc' was not found at sqlite:///"),
        ("download", "neuron-mlflow download: run 'abc' was not found at sqlite:///"),
        ("capture", "neuron-mlflow capture: run 'abc' was not found at sqlite:///"),
    ],
)
def test_an_unknown_run_is_still_bad_usage(verb, expected, tmp_path, monkeypatch, capsys) -> None:
    # a new store, as a user's first command makes it: MLflow's INFO lines of creating its
    # tables stay off stderr (on the suite's shared store only the first test saw them)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'new.db'}")
    err = _one_line_error(capsys, RUN_VERBS[verb])
    assert err.startswith(expected), err


# --- download of an ingested trace: Perfetto, and no progress bars ---


def test_download_of_an_ingested_trace_points_to_perfetto(tmp_path, capsys) -> None:
    trace = ROOT / "tests" / "data" / "traces" / "cpu_only_rank34.json.gz"
    spool = tmp_path / "spool"
    assert main(["ingest", str(trace), "--experiment", "ingested", "--local-dir", str(spool)]) == 0
    run_id = capsys.readouterr().out.split(" into run ")[1].split()[0]
    assert main(["download", run_id, "--dest", str(tmp_path / "d")]) == 0
    captured = capsys.readouterr()
    assert "Downloading artifacts" not in captured.err and "%|" not in captured.err
    opened = [line for line in captured.out.splitlines() if "https://ui.perfetto.dev" in line]
    assert len(opened) == 1 and "cpu_only_rank34.json.gz" in opened[0], captured.out


def test_viewer_commands_open_traces_but_not_other_json(tmp_path) -> None:
    from neuron_mlflow.sinks.download import viewer_commands

    rank = tmp_path / "rank_0"
    rank.mkdir()
    (rank / "host.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    (rank / "my_trace.json").write_text('{"schemaVersion": 1, "traceEvents": []}')
    (rank / "events.json.gz").write_bytes(gzip.compress(b"[]"))
    (rank / "neuron_info.json").write_text('{"instance": "trn1.2xlarge"}')  # not a trace
    (rank / "summary.json").write_text('{"traceEvents": "named like ours"}')
    (rank / "notes.txt").write_text("{}")
    opened = sorted(Path(c.split()[2]).name for c in viewer_commands(tmp_path))
    assert opened == ["events.json.gz", "host.pt.trace.json.gz", "my_trace.json"]


# --- sync --local-dir: a folder that is not there is a typo, not an empty spool ---


def test_sync_of_a_local_dir_that_is_not_a_folder_exits_2(tmp_path, capsys) -> None:
    missing = tmp_path / "no_such_spool"
    err = _one_line_error(capsys, ["sync", "--local-dir", str(missing)])
    assert (
        err
        == f"neuron-mlflow sync: --local-dir {missing}: not a spool folder (it does not exist)\n"
    )
    afile = tmp_path / "afile"
    afile.write_text("")
    err = _one_line_error(capsys, ["sync", "--local-dir", str(afile), "--prune"])
    assert (
        err == f"neuron-mlflow sync: --local-dir {afile}: not a spool folder (it is not a folder)\n"
    )
    assert afile.read_text() == ""
