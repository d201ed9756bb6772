"""Which MLflow run a step-driven front end logs to when its framework names none.

Example:
    >>> import mlflow
    >>> import neuron_mlflow as nm
    >>> with mlflow.start_run() as run:
    ...     uri, run_id = open_run(nm.ProfilerConfig())
    >>> run_id == run.info.run_id
    True
"""

from __future__ import annotations

import warnings

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.errors import NeuronMlflowWarning


def open_run(config: ProfilerConfig) -> tuple[str | None, str | None]:
    """The active MLflow run, else a new run in ``config.experiment_name``.

    Returns ``(tracking_uri, run_id)``; ``run_id`` is ``None`` when no run could be created
    (a warning says so, or strict mode raises): windows then stay pending in the spool.
    """
    import mlflow

    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

    active = mlflow.active_run()
    if active is not None:
        return mlflow.get_tracking_uri(), active.info.run_id
    sink = MlflowSink()
    try:
        sink.check_reachable()
        return sink.tracking_uri, sink.create_run(config.experiment_name, config.run_name)
    except Exception as exc:
        if config.strict:
            raise
        warnings.warn(
            f"neuron-mlflow: could not create an MLflow run at {sink.tracking_uri} "
            f"({type(exc).__name__}: {exc}); windows stay in {config.local_dir} "
            "(pending) for `neuron-mlflow sync`",
            NeuronMlflowWarning,
            stacklevel=3,
        )
        return sink.tracking_uri, None
