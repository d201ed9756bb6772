"""The command line: exit codes and messages."""

from __future__ import annotations

import subprocess
import sys

from neuron_mlflow.cli import main


def test_unknown_verb_and_bad_option_exit_2(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
    assert main(["sync", "--bogus"]) == 2
    assert main([]) == 2


def test_help_exits_0(capsys) -> None:
    assert main(["sync", "--help"]) == 0
    assert "--local-dir" in capsys.readouterr().out


def test_empty_spool_is_nothing_to_upload(tmp_path, capsys, monkeypatch) -> None:
    assert main(["sync", "--local-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"nothing to upload: no pending windows in {tmp_path}\n"
    monkeypatch.chdir(tmp_path)  # the default spool, not made yet: nothing to upload either
    assert main(["sync"]) == 0
    assert capsys.readouterr().out == (
        "nothing to upload: no pending windows "
        "(no spool at neuron_mlflow_traces; --local-dir names one)\n"
    )


def test_console_script_is_installed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "neuron_mlflow.cli", "sync", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and "pending" in result.stdout
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "neuron-mlflow"]
    assert script.value == "neuron_mlflow.cli:main"


def test_download_of_a_torch_trace_points_to_perfetto(tmp_path, capsys) -> None:
    import torch

    import neuron_mlflow as nm

    profiled = nm.profile(backend="cpu", schedule=nm.Schedule(warmup=0, active=1))(torch.ones)
    profiled(3)
    run_id = profiled.profiler.run_id
    profiled.profiler.close()  # its SIGTERM handler and request poller: not for later tests
    assert main(["download", run_id, "--dest", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "# window profile/step_000000-000000" in out
    assert "https://ui.perfetto.dev" in out and ".pt.trace.json.gz" in out


def test_an_unknown_option_is_the_verbs_error_with_its_usage(capsys) -> None:
    assert main(["compare", "a", "b", "--json"]) == 2
    err = capsys.readouterr().err
    assert "neuron-mlflow compare: error: unrecognized arguments: --json" in err
    assert "[--format {table,markdown,json}]" in err  # what it is called
