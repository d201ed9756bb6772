"""Which run a window goes to, as far as the training thread knows it.

The run is decided in this order: the MLflow run active on the training thread when the
window ended (MLflow's active run is per thread, so the session reads it there), else the
session's ``run_id``, else (in the worker process, with the window's record) the run the
sink chooses for the window's group (:meth:`~neuron_mlflow.sinks.mlflow_sink.MlflowSink.
run_for`), found again for the session's later windows.

Example:
    >>> target = RunTarget(explicit_run_id="abc", follow_active_run=False)
    >>> target.known_run()
    'abc'
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class RunTarget:
    """Where a session's windows go.

    Attributes:
        explicit_run_id: the run given by the caller, if any.
        tracking_uri: the tracking server; ``None`` means what MLflow resolves.
        follow_active_run: ``False`` ignores an active MLflow run.
    """

    explicit_run_id: str | None = None
    tracking_uri: str | None = None
    follow_active_run: bool = True

    def active_run(self) -> str | None:
        """The run active on the calling thread (call it on the training thread).

        Cheap when the user never imported MLflow: then no run can be active.
        """
        if not self.follow_active_run or "mlflow" not in sys.modules:
            return None
        from neuron_mlflow.sinks.mlflow_sink import active_run_id

        return active_run_id()

    def known_run(self, active: str | None = None) -> str | None:
        """The run decided without contacting MLflow: ``active``, else the explicit one."""
        return active or self.explicit_run_id
