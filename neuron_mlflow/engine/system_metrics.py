"""Neuron system metrics for the whole job: the ``neuron-monitor`` sampler, logged to MLflow
(docs/neuron.md). Until the run is known (made with the first upload) samples wait, bounded.

Example:
    >>> from neuron_mlflow.config import ProfilerConfig
    >>> system_metrics_wanted(ProfilerConfig(backend="cpu"), "cpu")
    False
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable

from neuron_mlflow.capture.backends.neuron_monitor import (
    NeuronMonitorSampler,
    Sample,
    monitor_path,
)
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.sinks.delivery import METRICS_PER_CALL

log = logging.getLogger("neuron_mlflow")

MAX_WAITING = 200_000
"""Samples kept while the run is not known yet (the oldest are dropped beyond)."""
_running: weakref.WeakSet[SystemMetrics] = weakref.WeakSet()


def system_metrics_wanted(config: ProfilerConfig, backend_name: str) -> bool:
    """Whether this process samples: ``neuron.system_metrics`` (default: Neuron and
    ``neuron-monitor`` on PATH), on local rank 0 only. Warns when ``neuron-monitor`` is
    missing though the option is on."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return False
    wanted = config.neuron.system_metrics
    if wanted is None:
        return backend_name == "neuron" and monitor_path() is not None
    if wanted and monitor_path() is None:
        warnings.warn(
            "neuron-mlflow: neuron.system_metrics=True but neuron-monitor is not on PATH "
            "(install aws-neuronx-tools); no system/neuron/... metrics are logged",
            NeuronMlflowWarning,
            stacklevel=3,
        )
        return False
    return bool(wanted)


class SystemMetrics:
    """The sampler and its MLflow logging for one session (or one attached front end).

    Args:
        run_id: returns the run to log into, or ``None`` while it is not known.
    """

    def __init__(
        self,
        config: ProfilerConfig,
        run_id: Callable[[], str | None],
        tracking_uri: str | None = None,
    ) -> None:
        self._run_id = run_id
        self._tracking_uri = tracking_uri
        self._waiting: list[Sample] = []
        self._lock = threading.Lock()
        self.sampler = NeuronMonitorSampler(self._log, period_s=config.neuron.monitor_period_s)

    def _log(self, samples: list[Sample]) -> None:
        with self._lock:
            self._waiting.extend(samples)
            del self._waiting[:-MAX_WAITING]
            run_id = self._run_id()
            if run_id is None:
                return
            batch, self._waiting = self._waiting, []
        from mlflow import MlflowClient
        from mlflow.entities import Metric

        client = MlflowClient(self._tracking_uri)
        metrics = [Metric(key, value, ts, step) for key, value, ts, step in batch]
        for i in range(0, len(metrics), METRICS_PER_CALL):
            client.log_batch(run_id, metrics=metrics[i : i + METRICS_PER_CALL], synchronous=True)

    def needs_run(self) -> bool:
        """True while samples wait for a run not known yet (made with the first upload)."""
        with self._lock:
            waiting = bool(self._waiting)
        return waiting and self._run_id() is None

    def stop(self) -> None:
        """Stop the sampler (process and thread) and log what is left. Idempotent."""
        _running.discard(self)
        self.sampler.stop()
        with self._lock:
            if not self._waiting:
                return
        try:
            self._log([])
        except Exception as exc:
            log.warning("neuron-mlflow: could not log neuron-monitor samples: %s", exc)
        with self._lock:
            if self._waiting:
                log.info(
                    "neuron-mlflow: %d neuron-monitor samples dropped: no run was known",
                    len(self._waiting),
                )
                self._waiting = []


def start_system_metrics(
    config: ProfilerConfig,
    backend_name: str,
    run_id: Callable[[], str | None],
    tracking_uri: str | None = None,
) -> SystemMetrics | None:
    """Start the sampler when :func:`system_metrics_wanted` and ``neuron-monitor`` runs;
    ``None`` otherwise."""
    if not system_metrics_wanted(config, backend_name):
        return None
    system = SystemMetrics(config, run_id, tracking_uri)
    if not system.sampler.start():
        return None
    _running.add(system)
    return system


@atexit.register
def _stop_all() -> None:
    for system in list(_running):
        system.stop()
