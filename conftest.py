"""Test set-up shared by tests and docstring examples.

Every test and example runs in its own temporary working directory, against one real MLflow
SQLite store for the whole run, with neuron-mlflow's strict mode on (our own failures raise
instead of warning) unless a test turns it off.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real MLflow SQLite store shared by the test run."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return f"sqlite:///{path}"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import mlflow

    # Lightning's MLFlowLogger calls mlflow.set_tracking_uri(), a process-wide setting that
    # would outlive its test: reset it so that MLFLOW_TRACKING_URI decides again.
    mlflow.set_tracking_uri(None)
    # mlflow.set_experiment() in one test (an id in the shared SQLite store) would otherwise be
    # the default experiment of every later test, even against another server.
    import mlflow.tracking.fluent as fluent

    monkeypatch.setattr(fluent, "_active_experiment_id", None)
    for name in list(os.environ):
        if name.startswith("NEURON_MLFLOW_") or name.startswith("MLFLOW_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    monkeypatch.setenv("NEURON_MLFLOW_STRICT", "1")
    # a worker process with no work left exits after 2 s (60 s in a job): the suite starts
    # hundreds of short sessions, each with a spool folder of its own
    monkeypatch.setenv("NEURON_MLFLOW_WORKER_IDLE_S", "2")
    monkeypatch.setenv("NEURON_MLFLOW_WORKER_PRELOAD", "0")  # imports on first use instead
    # no capture-request poller by default: sessions an earlier test never closed would poll
    # on in the background (a test of on-demand capture sets its own poll_s)
    monkeypatch.setenv("NEURON_MLFLOW_POLL_S", "0")
    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture(autouse=True)
def _default_sigusr2() -> None:
    """A test starts with SIGUSR2 at its default: a session an earlier test never closed (a
    decorated function) may still have its capture-request handler installed."""
    import signal

    from neuron_mlflow.engine import capture_requests

    capture_requests._signal_targets.clear()  # process-wide, as MLflow's active experiment
    capture_requests._installed.clear()
    if hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
