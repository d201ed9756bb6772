"""Neuron system metrics during the whole job, from ``neuron-monitor``.

A sampler thread runs ``neuron-monitor -c <config we write>``, parses each JSON report (one
per line on stdout) and hands the samples, batched, to a callback. The metrics and the report
fields they come from: docs/neuron.md, "Neuron system metrics for the whole job".

Example:
    >>> report = {"neuron_runtime_data": [{"report": {"neuroncore_counters": {
    ...     "neuroncores_in_use": {"0": {"neuroncore_utilization": 42.0}}}}}]}
    >>> parse_report(report)
    {'system/neuron/core_0/utilization_pct': 42.0}
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_mlflow.naming import system_metric_key

log = logging.getLogger("neuron_mlflow")

MONITOR = "neuron-monitor"
Sample = tuple[str, float, int, int]
"""``(key, value, timestamp_ms, step)``: one metric sample."""
APP_GROUPS = ("neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats")
SYSTEM_GROUPS = ("vcpu_usage", "memory_info", "neuron_hw_counters")


def monitor_path() -> str | None:
    """``neuron-monitor`` on ``PATH``, else ``None``."""
    return shutil.which(MONITOR)


def monitor_config(period_s: float) -> dict[str, Any]:
    """The config file's content: every group, every runtime on the host, one period."""
    return {
        "period": f"{period_s:g}s",
        "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": group} for group in APP_GROUPS]}
        ],
        "system_metrics": [{"type": group} for group in SYSTEM_GROUPS],
    }


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_report(report: dict[str, Any]) -> dict[str, float]:
    """One report's metrics, by docs/neuron.md's table (absent groups give nothing)."""
    out: dict[str, float] = {}

    def add(key: str, value: Any) -> None:
        number = _num(value)
        if number is not None:
            out[key] = out.get(key, 0.0) + number

    for runtime in report.get("neuron_runtime_data") or []:
        body = (runtime or {}).get("report") or {}
        cores = (body.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        for index, core in cores.items():
            util = _num((core or {}).get("neuroncore_utilization"))
            if util is not None:
                key = system_metric_key(f"core_{index}", "utilization_pct")
                out[key] = max(out.get(key, 0.0), util)
            add(system_metric_key(f"core_{index}", "flops"), (core or {}).get("flops"))
        memory = (body.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}
        add(system_metric_key("device_memory_used_bytes"), memory.get("neuron_device"))
        add(system_metric_key("host_memory_used_bytes"), memory.get("host"))
        stats = body.get("execution_stats") or {}
        errors = stats.get("error_summary") or {}
        for kind, count in errors.items():
            name = "numerical" if kind == "numeric" else kind
            add(system_metric_key("execution_errors", name), count)
            add(system_metric_key("execution_errors"), count)
        done = (stats.get("execution_summary") or {}).get("completed")
        add(system_metric_key("executions_completed"), done)
        latency = (stats.get("latency_stats") or {}).get("device_latency") or {}
        for pct in ("p50", "p99"):
            value = _num(latency.get(pct))
            if value is not None:
                out[system_metric_key(f"device_latency_{pct}_s")] = value
        vcpu = (body.get("neuron_runtime_vcpu_usage") or {}).get("vcpu_usage") or {}
        add(system_metric_key("runtime_vcpu_pct"), vcpu.get("user"))
        add(system_metric_key("runtime_vcpu_pct"), vcpu.get("system"))
    hw = ((report.get("system_data") or {}).get("neuron_hw_counters") or {}).get(
        "neuron_devices"
    ) or []
    for device in hw:
        for field in ("mem_ecc_uncorrected", "sram_ecc_uncorrected"):
            add(system_metric_key("ecc_uncorrected"), (device or {}).get(field))
    return out


class NeuronMonitorSampler:
    """Run ``neuron-monitor`` in the background and pass its samples to ``log_batch``.

    Args:
        log_batch: called with a list of :data:`Sample` tuples, from the sampler thread;
            its failures are logged and the sampler goes on.
        period_s: the report period written into the config (seconds).
        executable: the ``neuron-monitor`` to run (default: the one on ``PATH``).
        batch_reports: reports gathered before each ``log_batch`` call.

    Example:
        >>> sampler = NeuronMonitorSampler(lambda samples: None, executable="/nonexistent")
        >>> sampler.start()
        False
        >>> sampler.stop()
    """

    def __init__(
        self,
        log_batch: Callable[[list[Sample]], None],
        period_s: float = 5.0,
        executable: str | None = None,
        batch_reports: int = 6,
    ) -> None:
        self.log_batch = log_batch
        self.period_s = period_s
        self.executable = executable or monitor_path()
        self.batch_reports = max(batch_reports, 1)
        self.reports = 0
        self.instance_info: dict[str, Any] = {}
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._folder: Path | None = None
        self._pending: list[Sample] = []
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Start ``neuron-monitor`` and the reading thread; ``False`` when it cannot run."""
        if self._thread is not None or not self.executable:
            return False
        self._folder = Path(tempfile.mkdtemp(prefix="neuron_mlflow_monitor_"))
        config = self._folder / "monitor.json"
        config.write_text(json.dumps(monitor_config(self.period_s)))
        try:
            self._process = subprocess.Popen(
                [self.executable, "-c", str(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            log.warning("neuron-mlflow: could not start %s: %s", self.executable, exc)
            shutil.rmtree(self._folder, ignore_errors=True)
            return False
        self._thread = threading.Thread(
            target=self._read, name="neuron-mlflow-neuron-monitor", daemon=True
        )
        self._thread.start()
        return True

    def _read(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        for line in process.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if not isinstance(report, dict):
                continue
            self.instance_info = report.get("instance_info") or self.instance_info
            now_ms = int(time.time() * 1000)
            samples = [(k, v, now_ms, self.reports) for k, v in parse_report(report).items()]
            self.reports += 1
            with self._lock:
                self._pending.extend(samples)
                due = self.reports % self.batch_reports == 0
            if due:
                self.flush()

    def flush(self) -> None:
        """Send the samples gathered so far."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self.log_batch(batch)
        except Exception as exc:
            log.warning("neuron-mlflow: could not log neuron-monitor samples: %s", exc)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the process and the thread, and send what is left. Idempotent."""
        process, thread = self._process, self._thread
        self._process = None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)
        if thread is not None:
            thread.join(timeout=timeout_s)
            self._thread = None
        if process is not None and process.stdout is not None:
            process.stdout.close()
        self.flush()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
