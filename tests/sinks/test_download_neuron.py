"""`neuron-mlflow download` for Neuron windows: exactly the documented Explorer commands."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import mlflow

from neuron_mlflow.cli import main
from neuron_mlflow.sinks.download import viewer_commands
from tests.helpers import ROOT

DOUBLE = ROOT / "tests" / "neuron_double"
TOOLS = ROOT / "tests" / "neuron_tools"
WINDOW = "profile/step_000001-000002"
EXPORT = """
import sys, torch, torch_neuronx
from torch.profiler import ProfilerActivity, profile
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode
cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=sys.argv[1])
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
             experimental_config=cfg) as prof:
    _ = torch.ones(4) * 2
NeuronProfiler(cfg).export_trace(prof)
"""


def _two_rank_window(tmp_path: Path) -> str:
    """A run whose window holds two ranks' Neuron trees (two processes, two cores each)."""
    traces = tmp_path / "upload" / "traces"
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{ROOT}"}
        subprocess.run(
            [sys.executable, "-c", EXPORT, str(traces / f"rank_{rank}")], env=env, check=True
        )
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(traces), f"{WINDOW}/traces")
        mlflow.log_text("summary", f"{WINDOW}/summary.md")
    return run.info.run_id


def _profile_dirs(traces: Path) -> list[Path]:
    return sorted(p.parent for p in traces.rglob("trace_info.pb"))


def test_a_two_rank_two_core_window_prints_exactly_these_commands(tmp_path, capsys) -> None:
    run_id = _two_rank_window(tmp_path)
    dest = tmp_path / "fetched"
    assert main(["download", run_id, "--dest", str(dest)]) == 0
    out = capsys.readouterr().out.splitlines()
    traces = dest / "traces"
    assert out[0] == f"# window {WINDOW} of run {run_id}: traces in {traces}"
    rank0, rank1 = _profile_dirs(traces)
    assert rank0.parts[-3] == "rank_0" and rank1.parts[-3] == "rank_1"
    label = f"{run_id}/step_000001-000002"
    all_ranks = traces / "all_ranks"
    expected = [
        f"neuron-explorer view -d {rank0} --ingest-only --display-name {label}/rank_0",
        f"neuron-explorer view -d {rank1} --ingest-only --display-name {label}/rank_1",
        f"neuron-explorer view -d {all_ranks} --ingest-only --display-name {label}/all_ranks",
    ]
    for rank, folder in ((0, rank0), (1, rank1)):
        for core in (0, 1):
            ntff = f"profile_nc_{core}_session_0"
            expected.append(
                f"neuron-explorer view -n {folder / 'neff_0123abcd_vnc_0.neff'} "
                f"-s {folder / (ntff + '.ntff')} --ingest-only "
                f"--display-name {label}/rank_{rank}/{ntff}"
            )
    assert out[1:] == expected  # 7 commands, not 16
    # the all-ranks folder links every rank's <instance>_pid_<pid> folder
    linked = sorted(p.name for p in all_ranks.iterdir())
    assert linked == sorted({rank0.parent.name, rank1.parent.name}) and len(linked) == 2
    assert (all_ranks / rank0.parent.name / rank0.name / "trace_info.pb").is_file()


def test_open_runs_the_first_command_when_neuron_explorer_is_on_path(
    tmp_path, capsys, monkeypatch
) -> None:
    run_id = _two_rank_window(tmp_path)
    log = tmp_path / "explorer.jsonl"
    monkeypatch.setenv("FAKE_EXPLORER_LOG", str(log))
    monkeypatch.setenv("PATH", f"{TOOLS}{os.pathsep}{os.environ['PATH']}")
    assert main(["download", run_id, "--dest", str(tmp_path / "d"), "--open"]) == 0
    out = capsys.readouterr().out.splitlines()
    first = out[1]
    assert f"# running: {first}" in out
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call == shlex.split(first)[1:]
    # without neuron-explorer on PATH, --open says so and runs nothing
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert main(["download", run_id, "--dest", str(tmp_path / "e"), "--open"]) == 0
    assert "neuron-explorer is not on PATH" in capsys.readouterr().out
    assert len(log.read_text().splitlines()) == 1


def test_pairs_that_belong_together_and_a_shared_profile_tree(tmp_path) -> None:
    root = tmp_path / "traces"
    model = root / "rank_0" / "i-1_pid_7" / "20260421_153012_123"
    model.mkdir(parents=True)
    for name in ("trace_info.pb", "neff_111.neff", "neff_222.neff"):
        (model / name).write_bytes(b"x")
    (model / "111_instid_0_vnc_0.ntff").write_bytes(b"x")
    (model / "222_instid_0_vnc_1.ntff").write_bytes(b"x")
    (model / "333_instid_0_vnc_2.ntff").write_bytes(b"x")  # no neff_333.neff
    (model / "profile_nc_3_session_0.ntff").write_bytes(b"x")  # two neffs: which one?
    (model / "profile_nc_4_session_0.ntff").write_bytes(b"")  # a core opened, never used
    other = root / "rank_0" / "i-1_pid_8" / "20260421_153012_456"  # a second rank, same tree
    other.mkdir(parents=True)
    (other / "trace_info.pb").write_bytes(b"x")
    commands = [c.split(" --ingest-only")[0] for c in viewer_commands(root, "R/W")]
    assert commands == [
        f"neuron-explorer view -d {model}",
        f"neuron-explorer view -d {other}",
        f"neuron-explorer view -d {root / 'rank_0'}",
        f"neuron-explorer view -n {model / 'neff_111.neff'} -s {model / '111_instid_0_vnc_0.ntff'}",
        f"neuron-explorer view -n {model / 'neff_222.neff'} -s {model / '222_instid_0_vnc_1.ntff'}",
    ]
    assert viewer_commands(root, "R/W")[2].endswith("--display-name R/W/all_ranks")
    assert not (root / "all_ranks").exists()
    assert viewer_commands(root, "R/W")[0].endswith("--display-name R/W/rank_0/20260421_153012_123")
