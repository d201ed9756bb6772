"""Which MLflow run a step-driven front end logs to when its framework names none.

A run made here is this process's, as ``mlflow.start_run()``'s is: it is ``RUNNING`` while
the process runs and ends when the process exits, ``FINISHED``, or ``FAILED`` after an
uncaught exception (one exit hook, registered with the first such run); a killed process
leaves it ``RUNNING``.

Example:
    >>> import mlflow
    >>> import neuron_mlflow as nm
    >>> with mlflow.start_run() as run:
    ...     uri, run_id = open_run(nm.ProfilerConfig())
    >>> run_id == run.info.run_id
    True
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
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
        run_id = sink.create_run(config.experiment_name, config.run_name, running=True)
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
    if not _owned:
        atexit.register(_end_owned_runs)
    _owned.append((sink.tracking_uri, run_id, os.getpid()))
    return sink.tracking_uri, run_id


_owned: list[tuple[str, str, int]] = []
"""The runs :func:`open_run` made: ``(tracking_uri, run_id, pid)``, ended at exit."""


def _end_owned_runs() -> None:
    """At exit, end the runs this process made: ``FAILED`` after an uncaught exception (the
    interpreter's ``sys.last_value``), else ``FINISHED``. Never raises."""
    from mlflow import MlflowClient

    from neuron_mlflow.sinks.reachability import bounded_http

    failed = isinstance(getattr(sys, "last_value", None), BaseException)
    owned, _owned[:] = list(_owned), []
    for uri, run_id, pid in owned:
        if pid == os.getpid():  # (not in a forked child)
            with contextlib.suppress(Exception), bounded_http():
                MlflowClient(uri).set_terminated(run_id, "FAILED" if failed else "FINISHED")
