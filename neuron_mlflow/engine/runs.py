"""Which MLflow run a step-driven front end logs to when its framework names none, and its
end (``FINISHED``, ``FAILED``: docs/autolog.md).

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
import os
import sys
import warnings

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.guard import report
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
    _owned.append((sink.tracking_uri, run_id, os.getpid()))
    return sink.tracking_uri, run_id


_owned: list[tuple[str, str, int]] = []
"""The runs :func:`open_run` made and no one ended yet: ``(tracking_uri, run_id, pid)``."""


def end_run(run_id: str | None, exc: BaseException | None = None) -> None:
    """End ``run_id`` now if :func:`open_run` made it and it is still open: ``FINISHED``, or
    ``FAILED`` given the exception the job raised. Never raises: a failure is reported (the
    run stays ``RUNNING``)."""
    try:
        for owned in [o for o in _owned if o[1] == run_id]:
            _owned.remove(owned)
            uri, made, pid = owned
            if pid == os.getpid():  # (not in a forked child)
                from mlflow import MlflowClient

                from neuron_mlflow.sinks.reachability import bounded_http

                with bounded_http():
                    MlflowClient(uri).set_terminated(made, "FINISHED" if exc is None else "FAILED")
    except Exception as error:
        report(
            f"neuron-mlflow: could not end the MLflow run {run_id} ({type(error).__name__}: "
            f"{error}); it stays RUNNING, the job goes on"
        )


@atexit.register  # on import, as the engine's other exit hooks: it acts on `_owned` only
def _end_owned_runs() -> None:  # (an unregistered hook stays in atexit._ncallbacks() on 3.11)
    """At exit, end the runs still open: ``FAILED`` after an uncaught exception (the
    interpreter's ``sys.last_value``), else ``FINISHED``. Never raises."""
    failed = getattr(sys, "last_value", None)
    for _, run_id, _ in list(_owned):
        end_run(run_id, failed if isinstance(failed, BaseException) else None)
