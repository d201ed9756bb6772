"""Labels that agree: a Lightning window's report.html numbers its steps as the window does.

torch.profiler's ``ProfilerStep#N`` counts from the profiler's own start; the window
``step_000004-000006`` is the trainer's global steps 4-6. The page (header, window id,
timeline, per-step bars) shows the window's numbers; the headline counts aten operators.
"""

from __future__ import annotations

import json
import re

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

import neuron_mlflow as nm
from neuron_mlflow.sinks.spool import Spool


def _report(tmp_path) -> str:
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(wait=2, warmup=2, active=3),
        stages=("train",),
        backend="cpu",
        local_dir=tmp_path / "spool",
        keep_local=True,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=False,
        max_steps=9,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    assert callback.wait()  # report.html is the worker's
    (record,) = Spool(tmp_path / "spool").windows()
    assert record.artifact_path == "profile/train/step_000004-000006"
    return (record.artifacts_dir / "report.html").read_text(encoding="utf-8")


def test_a_lightning_windows_report_uses_the_windows_step_numbers_and_counts_aten_ops(
    tmp_path,
) -> None:
    page = _report(tmp_path)
    data = json.loads(re.search(r'id="nm-data">(.*?)</script>', page, re.S).group(1))
    timeline_steps = [step["step"] for step in data["timeline"]["steps"]]
    assert timeline_steps == [4, 5, 6], "the timeline draws 'step N' from these"
    trace_steps = [step["trace_step"] for step in data["timeline"]["steps"]]
    assert trace_steps != timeline_steps, "torch's count differs here, or this proves nothing"
    per_step = re.findall(r'<div class="muted">(?:<span [^>]*>)?step (\d+)', page)  # or marked
    assert per_step == ["4", "5", "6"]
    assert "<h1>Profile window steps 4-6</h1>" in page
    assert "profile/train/step_000004-000006" in page

    # the headline counts the aten ops a training step dispatches, not the few roots above
    totals = re.search(r'<p id="nm-totals">(.*?)</p>', page, re.S).group(1)
    aten = float(re.search(r"aten ops dispatched ([\d.]+)", totals).group(1))
    top = float(re.search(r"top-level calls ([\d.]+)", totals).group(1))
    assert aten > top, totals  # a training step dispatches many aten ops under few roots
    assert "op calls" not in totals
