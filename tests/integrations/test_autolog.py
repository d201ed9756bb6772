"""``nm.autolog()``: a Lightning fit and a Hugging Face ``Trainer.train`` each get exactly one
profiler callback (none after ``disable=True``), a plain loop's steps are its first
optimizer's steps (never a Trainer's, never inside an ``nm.profile``), a loop with no
optimizer gets one warning and finishes, and the window open at exit is handed over."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.integrations import autolog as autolog_module
from tests.helpers import ROOT, metric_history

SCHEDULE = nm.Schedule(warmup=1, active=2)


@pytest.fixture
def autologged(tmp_path: Path) -> Iterator[Path]:
    """``nm.autolog()`` in this process for one test (disabled after it)."""
    local_dir = tmp_path / "spool"
    nm.autolog(backend="cpu", local_dir=local_dir, schedule=SCHEDULE)
    try:
        yield local_dir
    finally:
        nm.autolog(disable=True)


def _train(optimizers: list[torch.optim.Optimizer], model: torch.nn.Module, order: list[int]):
    for index in order:
        optimizers[index].zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizers[index].step()


def _python(script: str, tmp_path: Path, tracking_uri: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env.update(
        MLFLOW_TRACKING_URI=tracking_uri, PYTHONPATH=str(ROOT), NEURON_MLFLOW_STRICT="1",
        NEURON_MLFLOW_POLL_S="0", NEURON_MLFLOW_WORKER_IDLE_S="2",
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=600, check=False,
    )  # fmt: skip


def test_a_loop_is_profiled_by_its_optimizer_steps(autologged) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _train([optimizer], model, [0] * 5)
    nm.autolog(disable=True)  # the window handed over and uploaded
    assert autolog_module.autolog_summary().steps == 2
    assert metric_history(autolog_module.autolog_run_id(), "profile/train/steps") == [(3, 2.0)]
    assert autolog_module._state.hook is None  # the hook is gone
    _train([optimizer], model, [0] * 5)
    assert autolog_module._state.clock_steps == 5


def test_several_optimizers_the_first_stepped_is_the_clock(autologged) -> None:
    generator, critic = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
    model = torch.nn.Sequential()  # (unused)
    optimizers = [
        torch.optim.SGD(generator.parameters(), lr=0.01),
        torch.optim.SGD(critic.parameters(), lr=0.01),
    ]
    del model
    for _ in range(6):  # one generator step, then three critic steps, per iteration
        _train(optimizers, generator, [0])
        _train(optimizers, critic, [1, 1, 1])
    assert autolog_module._state.clock_steps == 6
    assert autolog_module._state.optimizer_steps == 24
    nm.autolog(disable=True)
    assert autolog_module.autolog_summary().steps == 2


def test_a_new_optimizer_takes_over_when_the_clock_is_gone(autologged) -> None:
    model = torch.nn.Linear(8, 1)
    _train([torch.optim.SGD(model.parameters(), lr=0.01)], model, [0] * 2)
    _train([torch.optim.Adam(model.parameters(), lr=0.01)], model, [0] * 3)  # (first is gone)
    assert autolog_module._state.clock_steps == 5
    loop = autolog_module._state.loop
    assert loop is not None and loop.windows.next_step == 4  # the numbers went on


def test_an_open_nm_profile_owns_the_steps(autologged, tmp_path) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with nm.profile(backend="cpu", local_dir=tmp_path / "own", schedule=SCHEDULE) as prof:
        for _ in range(4):
            _train([optimizer], model, [0])
            prof.step()
    assert autolog_module._state.loop is None  # no step counted twice
    assert prof.summary.steps == 2


def test_a_failed_patch_is_a_warning() -> None:
    broken = types.ModuleType("lightning.pytorch")  # no Trainer in it
    with pytest.warns(NeuronMlflowWarning, match="could not attach to lightning.pytorch"):
        autolog_module._run_hook("lightning.pytorch", autolog_module._patch_lightning, broken)


HF_SETUP = """\
class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,))
        return {"input_ids": ids, "labels": ids}

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                   n_positions=32))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, report_to=[],
                         per_device_train_batch_size=2, use_cpu=True, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True)
"""
"""A tiny GPT-2, its data and its arguments (after `import torch, tempfile` and the
`transformers` names it uses)."""

TRAINERS = (
    """\
import sys, tempfile
import neuron_mlflow as nm
from neuron_mlflow.integrations import autolog as al

nm.autolog(backend="cpu", local_dir=sys.argv[1] if len(sys.argv) > 1 else "spool",
           schedule=nm.Schedule(warmup=1, active=2))
# imported after autolog(): patched when imported
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from neuron_mlflow.integrations.lightning import NeuronProfilerCallback

def fit(**kwargs):
    trainer = Trainer(max_steps=4, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, **kwargs)
    trainer.fit(BoringModel())
    return [c for c in trainer.callbacks if isinstance(c, NeuronProfilerCallback)]

ours = fit()
print("lightning", len(ours))
mine = NeuronProfilerCallback(backend="cpu", local_dir="spool-own")
given = fit(callbacks=[mine])
print("lightning-given", len(given), given[0] is mine)
from neuron_mlflow.integrations.transformers import HfProfilerCallback
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer as HfTrainer, TrainingArguments

"""
    + HF_SETUP
    + """\
trainer = HfTrainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
found = [c for c in trainer.callback_handler.callbacks if isinstance(c, HfProfilerCallback)]
print("hf", len(found))
print("hook steps", al._state.clock_steps, al._state.optimizer_steps)
ours[0].wait()
print("window", ours[0].summaries["train"].steps)
nm.autolog(disable=True)
print("disabled", len(fit()))
"""
)


@pytest.mark.slow
def test_each_trainer_gets_exactly_one_callback(tracking_uri, tmp_path) -> None:
    result = _python(TRAINERS, tmp_path, tracking_uri)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert "lightning 1" in lines
    assert "lightning-given 1 True" in lines  # the user's own, not a second one
    assert "hf 1" in lines
    assert "hook steps 0 0" in lines  # the Trainers' steps were their callbacks' only
    assert "window 2" in lines
    assert "disabled 0" in lines
    assert "no torch.optim optimizer stepped" not in result.stderr  # (the Trainers ran)


UNNAMED_TRAINER = (
    """\
import gc, tempfile
import torch
import neuron_mlflow as nm
from neuron_mlflow.integrations import autolog as al

nm.autolog(backend="cpu", local_dir="spool", experiment_name="unnamed-trainer",
           schedule=nm.Schedule(warmup=1, active=2))
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

"""
    + HF_SETUP
    + """\
Trainer(model=model, args=args, train_dataset=Tokens()).train()
gc.collect()
print("trainers alive", sum(isinstance(o, Trainer) for o in gc.get_objects()))
print("held", len(al._state.callbacks))
"""
)


@pytest.mark.slow
def test_the_callback_of_a_trainer_kept_in_no_variable_is_waited_for(
    tracking_uri, tmp_path
) -> None:
    """`Trainer(...).train()`: the exit still waits for its callback's windows (a weak
    reference let it go with the Trainer, and the run could end before its window)."""
    pytest.importorskip("transformers")
    result = _python(UNNAMED_TRAINER, tmp_path, tracking_uri)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert "trainers alive 0" in lines  # the Trainer is gone: only autolog holds its callback
    assert "held 1" in lines
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("unnamed-trainer")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert [value for _, value in metric_history(run.info.run_id, "profile/train/steps")] == [2.0]


OWN_CALLBACK = """\
import neuron_mlflow as nm
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

nm.autolog(backend="cpu", local_dir="spool")
callback = nm.NeuronProfilerCallback(backend="cpu", local_dir="spool")
trainer = Trainer(max_steps=3, logger=False, enable_checkpointing=False, callbacks=[callback],
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
trainer.fit(BoringModel())
print("fitted")
"""


@pytest.mark.slow
def test_a_fit_with_the_users_own_callback_is_no_loop_without_an_optimizer(
    tracking_uri, tmp_path
) -> None:
    result = _python(OWN_CALLBACK, tmp_path, tracking_uri)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "fitted" in result.stdout
    assert "no torch.optim optimizer stepped" not in result.stderr


NO_OPTIMIZER = """\
import sys, torch
import neuron_mlflow as nm

nm.autolog(backend="cpu", local_dir="spool")
model = torch.nn.Linear(4, 2)
with torch.no_grad():
    for _ in range(5):
        model(torch.randn(3, 4))
if sys.argv[1:] == ["disable"]:
    nm.autolog(disable=True)
print("finished")
"""


@pytest.mark.parametrize("how", ["exit", "disable"])
def test_a_loop_with_no_optimizer_gets_one_warning(tracking_uri, tmp_path, how) -> None:
    script = NO_OPTIMIZER.replace("sys.argv[1:]", "[" + repr(how) + "]")
    result = _python(script, tmp_path, tracking_uri)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "finished"  # the job finished
    assert result.stderr.count("no torch.optim optimizer stepped") == 1, result.stderr
    assert "@nm.profile" in result.stderr and "prof.step()" in result.stderr


OPEN_AT_EXIT = """\
import torch
import neuron_mlflow as nm
from neuron_mlflow.integrations.autolog import autolog_run_id

nm.autolog(backend="cpu", local_dir="spool", schedule=nm.Schedule(warmup=0, active=100))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
print(autolog_run_id())
"""


def test_the_window_open_at_exit_is_handed_over(tracking_uri, tmp_path) -> None:
    result = _python(OPEN_AT_EXIT, tmp_path, tracking_uri)
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = result.stdout.split()[-1]
    # steps 0-3 ended (step 4 began after the last optimizer step): partial, uploaded
    assert metric_history(run_id, "profile/train/steps") == [(4, 4.0)]
