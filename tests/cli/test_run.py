"""``neuron-mlflow run [options] -- COMMAND``: a plain PyTorch script that does not import
neuron_mlflow, profiled into one MLflow run, alone and under ``torchrun`` (gloo, CPU); the
command's exit code and signals pass through; bad options are one line and exit 2; a loop
without an optimizer gets one warning and finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli.run import field_options
from tests.helpers import artifact_files, metric_history

BIN = Path(sys.executable).parent

SCRIPT = """\
import os, sys
import torch

def main(steps, code):
    ddp = "RANK" in os.environ
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
    if ddp:
        dist.destroy_process_group()
    print("trained", "neuron_mlflow.cli" not in sys.modules)
    sys.exit(code)

main(int(sys.argv[1]), int(sys.argv[2]))
"""

NO_OPTIMIZER = """\
import torch
model = torch.nn.Linear(4, 2)
with torch.no_grad():
    for _ in range(5):
        model(torch.randn(3, 4))
print("inferred")
"""


def _env(tracking_uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # python, torchrun: this venv's
    env["NEURON_MLFLOW_STRICT"] = "1"
    env["NEURON_MLFLOW_WORKER_IDLE_S"] = "2"
    env["NEURON_MLFLOW_POLL_S"] = "0"
    return env


def _run(
    args: list[str], tmp_path: Path, tracking_uri: str, timeout: float = 600, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = _env(tracking_uri)
    env.update(extra)
    return subprocess.run(
        [str(BIN / "neuron-mlflow"), "run", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout, check=False,
    )  # fmt: skip


def _only_run(tracking_uri: str, experiment: str) -> str:
    client = MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0].info.run_id


def _options(tmp_path: Path, experiment: str) -> list[str]:
    return [
        "--backend", "cpu", "--schedule.warmup", "1", "--schedule.active", "3",
        "--local-dir", str(tmp_path / "spool"), "--experiment", experiment,
    ]  # fmt: skip


def test_a_plain_script_is_profiled_into_one_run(tracking_uri, tmp_path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    result = _run(
        [*_options(tmp_path, "run-plain"), "--", "python", "script.py", "8", "0"],
        tmp_path, tracking_uri,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "trained True" in result.stdout  # the script never imported our CLI
    run_id = _only_run(tracking_uri, "run-plain")
    assert run_id in result.stderr  # printed first, for `neuron-mlflow capture RUN_ID`
    # steps: the first optimizer.step() begins step 0; step 0 warms up, steps 1-3 recorded
    assert metric_history(run_id, "profile/train/steps") == [(4, 3.0)]
    files = artifact_files(run_id)
    assert "profile/train/step_000001-000003/summary.json" in files
    assert any(f.startswith("profile/train/step_000001-000003/traces/") for f in files)
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["neuron_mlflow.command"] == "python script.py 8 0"
    assert "no torch.optim optimizer stepped" not in result.stderr


def test_the_exit_code_is_the_commands(tracking_uri, tmp_path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    result = _run(
        [*_options(tmp_path, "run-exit"), "--", "python", "script.py", "6", "3"],
        tmp_path, tracking_uri,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr[-4000:]
    run_id = _only_run(tracking_uri, "run-exit")
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "FAILED"
    assert metric_history(run_id, "profile/train/steps") == [(4, 3.0)]  # still logged


@pytest.mark.slow
def test_torchrun_ranks_log_into_one_run(tracking_uri, tmp_path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    result = _run(
        [*_options(tmp_path, "run-ddp"), "--", "torchrun", "--nproc-per-node", "2",
         "script.py", "8", "0"],
        tmp_path, tracking_uri,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = _only_run(tracking_uri, "run-ddp")  # every rank in the one run
    for rank in (0, 1):  # each rank's own worker logs its times
        for name in ("cpu_time_us", "wall_time_us"):
            history = metric_history(run_id, f"profile/train/rank/{rank}/{name}")
            assert [step for step, _ in history] == [4], (rank, name, history)
            assert all(value > 0 for _, value in history)
    files = artifact_files(run_id)
    for rank in (0, 1):
        assert any(f.startswith(f"profile/train/step_000001-000003/traces/rank_{rank}/")
                   for f in files), rank  # fmt: skip
    assert MlflowClient(tracking_uri).get_run(run_id).data.tags["neuron_mlflow.world_size"] == "2"
    assert "no torch.optim optimizer stepped" not in result.stderr  # (torchrun's own process)


def test_a_loop_without_an_optimizer_gets_one_warning(tracking_uri, tmp_path) -> None:
    (tmp_path / "infer.py").write_text(NO_OPTIMIZER)
    result = _run(
        [*_options(tmp_path, "run-noopt"), "--", "python", "infer.py"], tmp_path, tracking_uri
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "inferred" in result.stdout  # the job finished
    assert result.stderr.count("no torch.optim optimizer stepped") == 1, result.stderr
    assert "nm.profile" in result.stderr and "prof.step()" in result.stderr


def test_bad_options_are_one_line_and_exit_2(tracking_uri, tmp_path) -> None:
    for args, expected in [
        (["--schedule.active", "0", "--", "true"], "--schedule.active '0'"),
        (["--backend", "tpu", "--", "true"], "'auto', 'neuron', 'cuda' or 'cpu'"),
        (["--frobnicate", "1", "--", "true"], "--frobnicate"),
        (["--backend", "cpu"], "no command"),
    ]:
        result = _run(args, tmp_path, tracking_uri)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert expected in result.stderr, result.stderr
    result = _run(["--", "no-such-command-here"], tmp_path, tracking_uri)
    assert result.returncode == 127 and "command not found" in result.stderr


def test_options_are_the_config_fields() -> None:
    flags = {o.flag: o.env for o in field_options()}
    assert flags["--schedule.warmup"] == "NEURON_MLFLOW_SCHEDULE__WARMUP"
    assert flags["--local-dir"] == "NEURON_MLFLOW_LOCAL_DIR"
    assert flags["--neuron.system-metrics"] == "NEURON_MLFLOW_NEURON__SYSTEM_METRICS"
    assert flags["--trigger.factor"] == "NEURON_MLFLOW_TRIGGER__FACTOR"
    assert "--run-name" in flags and "--experiment-name" in flags


def test_help_lists_the_fields(capsys) -> None:
    from neuron_mlflow.cli import main

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--schedule.warmup VALUE" in text and "--neuron.explorer-summary" in text
    assert "(auto, neuron, cuda, cpu)" in text and "%%" not in text


def test_a_missing_config_file_is_named_as_the_user_gave_it(tmp_path, monkeypatch, capsys):
    # --config becomes NEURON_MLFLOW_CONFIG for the processes; the message named the
    # variable, which the user never set
    from neuron_mlflow.cli.run import run_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURON_MLFLOW_CONFIG", raising=False)
    (tmp_path / "train.py").write_text("open('ran', 'w')\n")
    assert run_command(["--config", "nofile.yaml", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "neuron-mlflow run: --config names a file that does not exist: 'nofile.yaml'; "
        "give a YAML file of ProfilerConfig fields"
    ]
    assert run_command(["--config", str(tmp_path), "--", "python", "train.py"]) == 2
    assert "--config names a folder, not a file" in capsys.readouterr().err
    monkeypatch.setenv("NEURON_MLFLOW_CONFIG", str(tmp_path / "envfile.yaml"))
    assert run_command(["--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "NEURON_MLFLOW_CONFIG names a file that does not exist" in err
    assert "--config" not in err
    assert not (tmp_path / "ran").exists()  # checked before the command runs


def test_experiment_and_experiment_name_are_one_setting(capsys) -> None:
    import argparse

    from neuron_mlflow.cli import main
    from neuron_mlflow.cli.run import _config_env, build_run_parser

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for said in (
        "--experiment NAME MLflow experiment of the run (created if missing); the same "
        "setting as --experiment-name, and the one kept if both are given",
        "--experiment-name VALUE experiment for runs we create (the same setting as --experiment)",
    ):
        assert said in text
    options = field_options()
    args = build_run_parser(options).parse_args(
        ["--experiment-name", "b", "--experiment", "a", "--", "true"]
    )
    assert isinstance(args, argparse.Namespace)
    assert _config_env(args, options)["NEURON_MLFLOW_EXPERIMENT_NAME"] == "a"


def test_options_reach_every_process_as_the_environment(tracking_uri, tmp_path) -> None:
    code = (
        "import os, neuron_mlflow as nm; c = nm.ProfilerConfig(); "
        "print(c.schedule.active, c.neuron.modes, c.keep_local, c.experiment_name, "
        "os.environ['MLFLOW_RUN_ID'] == os.environ.get('EXPECTED', os.environ['MLFLOW_RUN_ID']))"
    )
    result = _run(
        ["--schedule.active", "7", "--neuron.modes", "device", "--keep-local",
         "--experiment", "run-env", "--", "python", "-c", code],
        tmp_path, tracking_uri,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["7", "('device',)", "True", "run-env", "True"]


def test_a_sitecustomize_of_the_user_still_runs(tracking_uri, tmp_path) -> None:
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('user sitecustomize')\n")
    code = (
        "import sys; "
        "print('autolog' if 'neuron_mlflow.integrations.autolog' in sys.modules else '-')"
    )
    result = _run(["--", "python", "-c", code], tmp_path, tracking_uri, PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr[-4000:]
    # (the verb's own interpreter ran the user's sitecustomize too: the first line)
    assert result.stdout.endswith("user sitecustomize\nautolog\n"), result.stdout


def test_our_failure_never_stops_the_program(tmp_path) -> None:
    """A process whose autolog cannot start (here: a config file that is gone) runs its
    training unprofiled, with one warning."""
    from neuron_mlflow.cli.run import SITE_DIR

    (tmp_path / "script.py").write_text(SCRIPT)
    env = _env(f"sqlite:///{tmp_path / 'x.db'}")
    env.update(
        NEURON_MLFLOW_AUTOLOG="1", PYTHONPATH=str(SITE_DIR), NEURON_MLFLOW_STRICT="0",
        NEURON_MLFLOW_CONFIG=str(tmp_path / "gone.yaml"),
    )  # fmt: skip
    result = subprocess.run(
        [sys.executable, "script.py", "6", "0"], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "trained" in result.stdout
    assert result.stderr.count("the training loop runs unprofiled") == 1, result.stderr


def test_sigterm_reaches_the_command(tracking_uri, tmp_path) -> None:
    (tmp_path / "wait.py").write_text(
        "import signal, sys, time\n"
        "def stop(*args):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [str(BIN / "neuron-mlflow"), "run", "--", "python", "wait.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tracking_uri),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err[-3000:]
    assert "got SIGTERM" in out


SLOW_LOOP = """\
import pathlib, time
import torch

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
deadline = time.monotonic() + 240
while not pathlib.Path("stop").exists() and time.monotonic() < deadline:
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    time.sleep(0.01)
print("stopped")
"""


@pytest.mark.slow
def test_a_schedule_with_no_window_is_profiled_on_demand(tracking_uri, tmp_path) -> None:
    """``--schedule.skip-first`` past the job's end: no window, until ``neuron-mlflow
    capture RUN_ID`` asks the running job for one (the processes' watcher polls the run)."""
    (tmp_path / "loop.py").write_text(SLOW_LOOP)
    env = _env(tracking_uri)
    env["NEURON_MLFLOW_POLL_S"] = "0.5"
    proc = subprocess.Popen(
        [str(BIN / "neuron-mlflow"), "run", "--backend", "cpu", "--schedule.skip-first",
         "1000000", "--local-dir", str(tmp_path / "spool"), "--", "python", "loop.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = iter(proc.stderr.readline, "")
        line = next((x for x in lines if "neuron-mlflow capture " in x), "")  # (MLflow's log)
        assert line, "the run id was not printed"
        run_id = line.split("neuron-mlflow capture ")[1].strip(" )\n")
        asked = subprocess.run(
            [str(BIN / "neuron-mlflow"), "capture", run_id, "--steps", "2", "--warmup", "0",
             "--wait", "--timeout", "180"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240, check=False,
        )  # fmt: skip
    finally:
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=240)
    spool = tmp_path / "spool"  # what a failure needs to be read (it failed once in CI)
    seen = [str(p.relative_to(spool)) for p in sorted(spool.rglob("*")) if p.is_file()]
    log = (spool / "worker.log").read_text() if (spool / "worker.log").is_file() else "no log"
    why = f"{asked.stdout}{asked.stderr}\njob: {err[-2000:]}\nspool: {seen}\nworker: {log[-2000:]}"
    assert asked.returncode == 0, why
    assert proc.returncode == 0, err[-3000:]
    assert "stopped" in out
    assert [value for _, value in metric_history(run_id, "profile/train/steps")] == [2.0]


READY_LOOP = """\
import time
import torch

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100000):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    if step == 6:
        print("ready", flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_sigterm_keeps_the_open_window(tracking_uri, tmp_path) -> None:
    """SIGTERM to the verb reaches the command, whose handler keeps the open window (logged
    as partial) before the process dies of it: exit 128 + 15."""
    (tmp_path / "loop.py").write_text(READY_LOOP)
    proc = subprocess.Popen(
        [str(BIN / "neuron-mlflow"), "run", "--backend", "cpu", "--schedule.warmup", "0",
         "--schedule.active", "100000", "--local-dir", str(tmp_path / "spool"),
         "--experiment", "run-sigterm", "--", "python", "loop.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tracking_uri),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    run_id = _only_run(tracking_uri, "run-sigterm")
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "KILLED"
    deadline = time.monotonic() + 120  # the worker uploads it after the process died
    while not (history := metric_history(run_id, "profile/train/steps")):
        assert time.monotonic() < deadline, "the window kept at SIGTERM never landed"
        time.sleep(0.5)
    assert history[0][1] >= 6


def test_ctrl_c_reaches_the_command(tracking_uri, tmp_path) -> None:
    """SIGINT (Ctrl-C at a terminal reaches the verb) goes to the command once: its
    KeyboardInterrupt ends it, exit 128 + 2, the run KILLED."""
    (tmp_path / "loop.py").write_text(READY_LOOP)
    proc = subprocess.Popen(
        [str(BIN / "neuron-mlflow"), "run", "--backend", "cpu", "--local-dir",
         str(tmp_path / "spool"), "--experiment", "run-sigint", "--", "python", "loop.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tracking_uri),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
    finally:  # a command that ignores SIGINT (started with it ignored) is not left running
        if proc.poll() is None:
            proc.terminate()  # the verb passes SIGTERM on to the command
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert err.count("KeyboardInterrupt") == 1, err[-3000:]
    run_id = _only_run(tracking_uri, "run-sigint")
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "KILLED"


LIGHTNING = """\
import mlflow
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger


class Logged(BoringModel):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("loss", out["loss"])
        return out


logger = MLFlowLogger(experiment_name="its-own", tracking_uri=mlflow.get_tracking_uri())
trainer = Trainer(max_steps=6, logger=logger, log_every_n_steps=1, limit_val_batches=0,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
trainer.fit(Logged())
"""


@pytest.mark.slow
def test_a_lightning_script_logs_into_the_one_run(tracking_uri, tmp_path) -> None:
    """The Trainer gets its callback, and its MLFlowLogger (which ignores MLFLOW_RUN_ID by
    itself) logs into the verb's run: the loss curve beside the windows."""
    (tmp_path / "fit.py").write_text(LIGHTNING)
    result = _run(
        [*_options(tmp_path, "run-lightning"), "--", "python", "fit.py"], tmp_path, tracking_uri
    )
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = _only_run(tracking_uri, "run-lightning")
    assert metric_history(run_id, "profile/train/steps") == [(4, 3.0)]
    assert len(metric_history(run_id, "loss")) >= 5
    assert MlflowClient(tracking_uri).get_experiment_by_name("its-own") is None


HF = """\
import tempfile
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,))
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                   n_positions=32))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=6, logging_steps=1,
                         per_device_train_batch_size=2, report_to=["mlflow"], use_cpu=True,
                         save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
import gc

gc.collect()  # the Trainer, kept in no variable, is gone: autolog still waits for its callback
"""


@pytest.mark.slow
def test_a_transformers_script_logs_into_the_one_run(tracking_uri, tmp_path) -> None:
    """The Trainer gets its HfProfilerCallback, and Transformers' MLflowCallback resumes the
    verb's run (MLFLOW_RUN_ID): its loss curve beside the windows."""
    pytest.importorskip("neuron_mlflow.integrations.transformers")
    (tmp_path / "train.py").write_text(HF)
    result = _run(
        [*_options(tmp_path, "run-hf"), "--", "python", "train.py"], tmp_path, tracking_uri
    )
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = _only_run(tracking_uri, "run-hf")
    assert [value for _, value in metric_history(run_id, "profile/train/steps")] == [3.0]
    assert len(metric_history(run_id, "loss")) >= 5
