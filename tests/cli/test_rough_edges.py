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
from pathlib import Path

import pytest
import yaml

from neuron_mlflow.cli import main
from neuron_mlflow.cli.app import EXIT_USAGE
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
