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

# Public name -> the module that holds it, imported on first use (``__getattr__``).
_EXPORTS = {
    "BackendUnavailableError": "neuron_mlflow.errors",
    "ConfigError": "neuron_mlflow.errors",
    "NeuronMlflowError": "neuron_mlflow.errors",
    "NeuronMlflowWarning": "neuron_mlflow.errors",
    "HfProfilerCallback": "neuron_mlflow.integrations.transformers",
    "NeuronOptions": "neuron_mlflow.config",
    "NeuronProfilerCallback": "neuron_mlflow.integrations.lightning",
    "OpStats": "neuron_mlflow.summary.ops",
    "OpSummary": "neuron_mlflow.summary.ops",
    "Profiler": "neuron_mlflow.integrations.decorator",
    "ProfilerConfig": "neuron_mlflow.config",
    "ProfilingSession": "neuron_mlflow.engine.session",
    "Schedule": "neuron_mlflow.config",
    "SlowSteps": "neuron_mlflow.config",
    "comparison_report": "neuron_mlflow.summary.comparison_html",
    "compare_runs": "neuron_mlflow.sinks.profiles",
    "publish_comparison": "neuron_mlflow.sinks.comparison_files",
    "SyncReport": "neuron_mlflow.sinks.pending",
    "autolog": "neuron_mlflow.integrations.autolog",
    "profile": "neuron_mlflow.integrations.decorator",
    "render_side_by_side": "neuron_mlflow.summary.tables",
    "sync_pending": "neuron_mlflow.engine.sync",
}

if _TYPE_CHECKING:  # each name re-exported explicitly (`as`), for type checkers
    from neuron_mlflow.config import NeuronOptions as NeuronOptions
    from neuron_mlflow.config import ProfilerConfig as ProfilerConfig
    from neuron_mlflow.config import Schedule as Schedule
    from neuron_mlflow.config import SlowSteps as SlowSteps
    from neuron_mlflow.engine.session import ProfilingSession as ProfilingSession
    from neuron_mlflow.engine.sync import sync_pending as sync_pending
    from neuron_mlflow.errors import BackendUnavailableError as BackendUnavailableError
    from neuron_mlflow.errors import ConfigError as ConfigError
    from neuron_mlflow.errors import NeuronMlflowError as NeuronMlflowError
    from neuron_mlflow.errors import NeuronMlflowWarning as NeuronMlflowWarning
    from neuron_mlflow.integrations.autolog import autolog as autolog
    from neuron_mlflow.integrations.decorator import Profiler as Profiler
    from neuron_mlflow.integrations.decorator import profile as profile
    from neuron_mlflow.integrations.lightning import (
        NeuronProfilerCallback as NeuronProfilerCallback,
    )
    from neuron_mlflow.integrations.transformers import HfProfilerCallback as HfProfilerCallback
    from neuron_mlflow.sinks.comparison_files import publish_comparison as publish_comparison
    from neuron_mlflow.sinks.pending import SyncReport as SyncReport
    from neuron_mlflow.sinks.profiles import compare_runs as compare_runs
    from neuron_mlflow.summary.comparison_html import comparison_report as comparison_report
    from neuron_mlflow.summary.ops import OpStats as OpStats
    from neuron_mlflow.summary.ops import OpSummary as OpSummary
    from neuron_mlflow.summary.tables import render_side_by_side as render_side_by_side


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


__all__ = [*_EXPORTS]
