"""Neuron system metrics from the fake `neuron-monitor` on PATH (tests/neuron_tools/).

The fake prints one documented-shaped JSON report per period until it is terminated and
writes its pid to $FAKE_MONITOR_PIDFILE.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import mlflow
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import MLFlowLogger
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.capture.backends.neuron_monitor import (
    NeuronMonitorSampler,
    monitor_config,
    parse_report,
)
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.system_metrics import system_metrics_wanted
from tests.helpers import ROOT

TOOLS = ROOT / "tests" / "neuron_tools"
DOCUMENTED = {
    "neuron_runtime_data": [
        {
            "pid": 4242,
            "report": {
                "neuroncore_counters": {
                    "neuroncores_in_use": {"0": {"neuroncore_utilization": 42.0, "flops": 1.2e12}}
                },
                "execution_stats": {
                    "error_summary": {"generic": 0, "numerical": 2, "hardware": 1},
                    "execution_summary": {"completed": 120},
                    "latency_stats": {"device_latency": {"p50": 0.010, "p99": None}},
                },
                "memory_used": {
                    "neuron_runtime_used_bytes": {"host": 7e9, "neuron_device": 12.5e9}
                },
                "neuron_runtime_vcpu_usage": {"vcpu_usage": {"user": 42.0, "system": 12.3}},
            },
        }
    ],
    "system_data": {
        "neuron_hw_counters": {
            "neuron_devices": [{"mem_ecc_uncorrected": 0, "sram_ecc_uncorrected": 1}]
        }
    },
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped: check /proc state
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


@pytest.fixture
def monitor_on_path(monkeypatch, tmp_path) -> Path:
    pidfile = tmp_path / "monitor.pid"
    monkeypatch.setenv("PATH", f"{TOOLS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MONITOR_PIDFILE", str(pidfile))
    return pidfile


def _samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "neuron-mlflow-neuron-monitor"]


def test_a_documented_report_gives_the_documented_names() -> None:
    assert parse_report(DOCUMENTED) == {
        "system/neuron/core_0/utilization_pct": 42.0,
        "system/neuron/core_0/flops": 1.2e12,
        "system/neuron/device_memory_used_bytes": 12.5e9,
        "system/neuron/host_memory_used_bytes": 7e9,
        "system/neuron/execution_errors/generic": 0.0,
        "system/neuron/execution_errors/numerical": 2.0,
        "system/neuron/execution_errors/hardware": 1.0,
        "system/neuron/execution_errors": 3.0,
        "system/neuron/executions_completed": 120.0,
        "system/neuron/device_latency_p50_s": 0.010,
        "system/neuron/runtime_vcpu_pct": pytest.approx(54.3),
        "system/neuron/ecc_uncorrected": 1.0,
    }
    assert parse_report({}) == {}
    config = monitor_config(0.5)
    assert config["period"] == "0.5s"
    assert {g["type"] for g in config["neuron_runtimes"][0]["metrics"]} == {
        "neuroncore_counters",
        "memory_used",
        "neuron_runtime_vcpu_usage",
        "execution_stats",
    }


def test_the_sampler_batches_reports_and_leaves_nothing_behind(monitor_on_path) -> None:
    batches: list[list[tuple]] = []
    sampler = NeuronMonitorSampler(batches.append, period_s=0.05, batch_reports=3)
    assert sampler.start()
    deadline = time.monotonic() + 60
    while sampler.reports < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    pid = int(monitor_on_path.read_text())
    assert not _alive(pid) and not _samplers()
    assert sampler.instance_info["instance_type"] == "trn2.48xlarge"
    samples = [s for batch in batches for s in batch]
    util = [s for s in samples if s[0] == "system/neuron/core_0/utilization_pct"]
    assert len(util) >= 7 and [s[1] for s in util[:3]] == [40.0, 41.0, 42.0]
    assert [s[3] for s in util] == sorted(s[3] for s in util)  # steps: report index
    sampler.stop()  # idempotent


def test_the_option_decides_and_says_when_neuron_monitor_is_missing(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not system_metrics_wanted(ProfilerConfig(backend="cpu"), "neuron")
    with pytest.warns(nm.NeuronMlflowWarning, match="neuron-monitor is not on PATH"):
        wanted = system_metrics_wanted(
            ProfilerConfig(backend="cpu", neuron={"system_metrics": True}), "cpu"
        )
    assert not wanted
    monkeypatch.setenv("PATH", str(TOOLS))
    assert system_metrics_wanted(ProfilerConfig(backend="cpu"), "neuron")
    assert not system_metrics_wanted(ProfilerConfig(backend="cpu"), "cpu")
    monkeypatch.setenv("LOCAL_RANK", "1")  # one sampler per host
    assert not system_metrics_wanted(ProfilerConfig(backend="cpu"), "neuron")


class _WaitingModel(BoringModel):
    """Its first and last training steps wait (bounded) for neuron-monitor reports, so that
    the fit spans several of them however slowly the fake starts on a busy machine."""

    def __init__(self, callback, last: int) -> None:
        super().__init__()
        self.callback, self.last = callback, last

    def _wait_for(self, reports: int) -> None:
        deadline = time.monotonic() + 60
        system = self.callback.attachment._system
        while system.sampler.reports < reports and time.monotonic() < deadline:
            time.sleep(0.02)

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self._wait_for(1)
        if batch_idx == self.last:
            self._wait_for(self.callback.attachment._system.sampler.reports + 3)
        return super().training_step(batch, batch_idx)


def test_trainer_fit_logs_system_metrics_for_the_whole_fit(monitor_on_path, tracking_uri):
    logger = MLFlowLogger(experiment_name="neuron-monitor-fit", tracking_uri=tracking_uri)
    callback = nm.NeuronProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2),
        backend="cpu",
        neuron={"system_metrics": True, "monitor_period_s": 0.05},
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=logger,
        max_steps=40,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_WaitingModel(callback, last=39))
    history = MlflowClient().get_metric_history(
        logger.run_id, "system/neuron/core_0/utilization_pct"
    )
    assert len({m.timestamp for m in history}) >= 3, "samples at several times"
    assert (
        MlflowClient().get_run(logger.run_id).data.metrics["system/neuron/device_memory_used_bytes"]
        >= 12_500_000_000
    )
    # the whole fit, not only the profiled window (steps 1-2 of 40)
    assert max(m.step for m in history) >= 3
    assert not _samplers(), "the sampler thread is gone after fit"
    assert not _alive(int(monitor_on_path.read_text())), "neuron-monitor is gone after fit"


def test_the_decorator_session_samples_until_close(monitor_on_path, tracking_uri, tmp_path):
    mlflow.set_experiment("neuron-monitor-decorator")
    profiled = nm.profile(
        backend="cpu",
        schedule=nm.Schedule(warmup=0, active=1),
        local_dir=str(tmp_path / "spool"),
        neuron={"system_metrics": True, "monitor_period_s": 0.05},
    )(lambda x: x * 2)
    profiled(__import__("torch").ones(4))
    system = profiled.profiler.session._system
    deadline = time.monotonic() + 60  # a busy machine starts the fake slowly
    while system.sampler.reports < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    profiled.profiler.close()
    run_id = profiled.profiler.run_id
    history = MlflowClient().get_metric_history(run_id, "system/neuron/core_1/utilization_pct")
    assert len(history) >= 2
    assert not _samplers() and not _alive(int(monitor_on_path.read_text()))
