"""neuron-mlflow: accelerator profiling (Trainium, CUDA, CPU) as part of MLflow tracking.

Importing the package is light: torch and mlflow are imported when a window is captured or
logged, not at import time.

Example:
    >>> import neuron_mlflow as nm
    >>> nm.ProfilerConfig(backend="cpu").schedule
    Schedule(skip_first=0, wait=0, warmup=1, active=3, repeat=1)
"""

from neuron_mlflow.config import NeuronOptions, ProfilerConfig, Schedule
from neuron_mlflow.decorator import Profiler, profile
from neuron_mlflow.errors import (
    BackendUnavailableError,
    ConfigError,
    NeuronMlflowError,
)
from neuron_mlflow.mlflow_sink import SyncReport, sync_pending
from neuron_mlflow.session import NeuronMlflowWarning, ProfilingSession
from neuron_mlflow.summary import OpStats, OpSummary, render_side_by_side


def __getattr__(name: str) -> object:
    """Load the Lightning callback on first use, so ``import neuron_mlflow`` stays light."""
    if name == "NeuronProfilerCallback":
        from neuron_mlflow.callback import NeuronProfilerCallback

        return NeuronProfilerCallback
    raise AttributeError(f"module 'neuron_mlflow' has no attribute {name!r}")


__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "NeuronMlflowError",
    "NeuronMlflowWarning",
    "NeuronOptions",
    "NeuronProfilerCallback",
    "OpStats",
    "OpSummary",
    "Profiler",
    "ProfilerConfig",
    "ProfilingSession",
    "Schedule",
    "SyncReport",
    "profile",
    "render_side_by_side",
    "sync_pending",
]
