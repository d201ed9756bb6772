"""neuron-mlflow: accelerator profiling (Trainium, CUDA, CPU) as part of MLflow tracking.

Importing the package is light: torch and mlflow are imported when a window is captured or
logged, not at import time.

Example:
    >>> import neuron_mlflow as nm
    >>> nm.ProfilerConfig(backend="cpu").schedule
    Schedule(skip_first=0, wait=0, warmup=1, active=3, repeat=1)
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

# Public name -> the module that holds it. Loaded on first use, so that importing one
# module (``neuron_mlflow.trace_summary`` for the CLI's ``summarize``, say) pulls in only
# what it needs, not pydantic or Lightning.
_EXPORTS = {
    "BackendUnavailableError": "neuron_mlflow.errors",
    "ConfigError": "neuron_mlflow.errors",
    "NeuronMlflowError": "neuron_mlflow.errors",
    "NeuronMlflowWarning": "neuron_mlflow.session",
    "NeuronOptions": "neuron_mlflow.config",
    "NeuronProfilerCallback": "neuron_mlflow.callback",
    "OpStats": "neuron_mlflow.summary",
    "OpSummary": "neuron_mlflow.summary",
    "Profiler": "neuron_mlflow.decorator",
    "ProfilerConfig": "neuron_mlflow.config",
    "ProfilingSession": "neuron_mlflow.session",
    "Schedule": "neuron_mlflow.config",
    "SyncReport": "neuron_mlflow.mlflow_sink",
    "profile": "neuron_mlflow.decorator",
    "render_side_by_side": "neuron_mlflow.summary",
    "sync_pending": "neuron_mlflow.mlflow_sink",
}

if _TYPE_CHECKING:
    from neuron_mlflow.callback import NeuronProfilerCallback
    from neuron_mlflow.config import NeuronOptions, ProfilerConfig, Schedule
    from neuron_mlflow.decorator import Profiler, profile
    from neuron_mlflow.errors import BackendUnavailableError, ConfigError, NeuronMlflowError
    from neuron_mlflow.mlflow_sink import SyncReport, sync_pending
    from neuron_mlflow.session import NeuronMlflowWarning, ProfilingSession
    from neuron_mlflow.summary import OpStats, OpSummary, render_side_by_side


def __getattr__(name: str) -> object:
    """Load a public name's module on first use, so ``import neuron_mlflow`` stays light."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neuron_mlflow' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
