"""Output paths a verb cannot use: `download --dest`, `compare --html`, `ingest --local-dir`
and `run --local-dir` given a file, or a path that cannot be made, and `compare --log-to` an
unknown run. Each is one line on stderr naming the path (or run) with exit code 2, given
before any work (nothing on stdout, no run made), against a real MLflow SQLite store."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from neuron_mlflow.cli.app import EXIT_USAGE
from tests.helpers import ROOT

TRACE = ROOT / "tests" / "data" / "traces" / "cpu_only_rank34.json.gz"


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "", captured.out  # rejected before any work
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


@pytest.fixture
def profiled_run(tmp_path, capsys) -> str:
    """A run with one profiled window (an ingested trace)."""
    ingest = ["ingest", str(TRACE), "--experiment", "paths", "--local-dir", str(tmp_path / "s")]
    assert main(ingest) == 0, capsys.readouterr().err
    run_id = capsys.readouterr().out.split(" into run ")[1].split()[0]
    return run_id


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "somefile.py"
    path.write_text("print('hello')\n")
    return path


def _bad_folders(a_file: Path) -> list[Path]:
    """A file, a path under a file, and (on Linux) a path under /proc: none can be a folder."""
    bad = [a_file, a_file / "sub"]
    if Path("/proc/self").is_dir():
        bad.append(Path("/proc/neuron-mlflow-x"))
    return bad


def test_download_dest_that_cannot_be_a_folder(profiled_run, a_file, tmp_path, capsys) -> None:
    for dest in _bad_folders(a_file):
        err = _one_line_error(capsys, ["download", profiled_run, "--dest", str(dest)])
        assert err.startswith(f"neuron-mlflow download: --dest {dest}: "), err
    assert a_file.read_text() == "print('hello')\n"
    assert main(["download", profiled_run, "--dest", str(tmp_path / "new" / "d")]) == 0


def test_compare_html_that_cannot_be_written(profiled_run, a_file, tmp_path, capsys) -> None:
    for html in [tmp_path, a_file / "comparison.html"] + (
        [Path("/proc/x.html")] if Path("/proc/self").is_dir() else []
    ):
        argv = ["compare", profiled_run, profiled_run, "--html", str(html)]
        err = _one_line_error(capsys, argv)
        assert err.startswith(f"neuron-mlflow compare: --html {html}: "), err
    good = tmp_path / "new" / "comparison.html"
    assert main(["compare", profiled_run, profiled_run, "--html", str(good)]) == 0
    assert good.read_text(encoding="utf-8").startswith("<!")


def test_publish_comparison_says_which_path_it_cannot_write(tmp_path) -> None:
    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.comparison_files import publish_comparison
    from neuron_mlflow.summary.comparison import RunProfile, compare_profiles

    a = RunProfile("a", "naive", "p", {"cpu_time_us": 125.0}, {})
    b = RunProfile("b", "fused", "p", {"cpu_time_us": 48.0}, {})
    with pytest.raises(CompareError, match=f"--html {tmp_path}: "):
        publish_comparison(compare_profiles([a, b]), html_path=tmp_path)


def test_compare_log_to_an_unknown_run_before_comparing(profiled_run, tracking_uri, capsys):
    argv = ["compare", profiled_run, profiled_run, "--log-to", "deadbeef"]
    err = _one_line_error(capsys, argv)
    assert err == (
        f"neuron-mlflow compare: --log-to: run 'deadbeef' was not found at {tracking_uri}\n"
    )


def test_ingest_local_dir_that_cannot_be_a_folder(a_file, capsys) -> None:
    experiment = f"paths-{uuid.uuid4().hex[:8]}"
    for local_dir in _bad_folders(a_file):
        argv = ["ingest", str(TRACE), "--experiment", experiment, "--local-dir", str(local_dir)]
        err = _one_line_error(capsys, argv)
        assert err.startswith(f"neuron-mlflow ingest: --local-dir {local_dir}: "), err
    assert MlflowClient().get_experiment_by_name(experiment) is None  # no run made


def test_run_local_dir_that_cannot_be_a_folder(a_file, capsys) -> None:
    experiment = f"paths-{uuid.uuid4().hex[:8]}"
    marker = a_file.parent / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    for local_dir in _bad_folders(a_file):
        argv = ["run", "--backend", "cpu", "--experiment", experiment]
        err = _one_line_error(capsys, [*argv, "--local-dir", str(local_dir), "--", *command])
        assert err.startswith(f"neuron-mlflow run: --local-dir {local_dir}: "), err
    assert not marker.exists()  # the command did not start
    assert MlflowClient().get_experiment_by_name(experiment) is None  # no run made
