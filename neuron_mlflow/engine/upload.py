"""Which run a window goes to, and its upload (run on the background worker).

The run is decided in this order: the MLflow run active on the training thread when the
window ended (MLflow's active run is per thread, so the session reads it there), else the
session's ``run_id``, else a run the session creates once and reuses for later windows.

Example:
    >>> target = RunTarget(explicit_run_id="abc", follow_active_run=False)
    >>> target.known_run()
    'abc'
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.sinks.spool import WindowRecord

log = logging.getLogger("neuron_mlflow")


@dataclass
class RunTarget:
    """Where a session's windows go.

    Attributes:
        explicit_run_id: the run given by the caller, if any.
        tracking_uri: the tracking server; ``None`` means what MLflow resolves.
        follow_active_run: ``False`` ignores an active MLflow run.
        own_run_id: the run this session created (after its first upload).
        warned: a failed upload was reported (later failures only go to the log).
    """

    explicit_run_id: str | None = None
    tracking_uri: str | None = None
    follow_active_run: bool = True
    own_run_id: str | None = None
    warned: bool = False

    def active_run(self) -> str | None:
        """The run active on the calling thread (call it on the training thread).

        Cheap when the user never imported MLflow: then no run can be active.
        """
        if not self.follow_active_run or "mlflow" not in sys.modules:
            return None
        from neuron_mlflow.sinks.mlflow_sink import active_run_id

        return active_run_id()

    def known_run(self, active: str | None = None) -> str | None:
        """The run decided without contacting MLflow: ``active``, explicit, or our own."""
        return active or self.explicit_run_id or self.own_run_id


def upload_window(
    record: WindowRecord,
    target: RunTarget,
    config: ProfilerConfig,
    run_tags: dict[str, str],
    active_run: str | None,
) -> str | None:
    """Upload one spooled window; on failure keep it pending and warn (or raise if strict).

    Args:
        record: the spooled window.
        target: where it goes; ``own_run_id`` is set when a run is created.
        config: the session's configuration (experiment, run name, strict, local_dir).
        run_tags: tags of a run created here.
        active_run: the run active on the training thread when the window ended.

    Returns:
        The run the window was logged to, or ``None`` when it stays in the spool.
    """
    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

    sink: Any = None
    try:
        sink = MlflowSink(target.tracking_uri)
        run_id = target.known_run(active_run)
        record.update(tracking_uri=sink.tracking_uri, run_id=run_id)
        sink.check_reachable()
        if run_id is None:
            run_id = target.own_run_id = sink.create_run(
                config.experiment_name, config.run_name, tags=run_tags
            )
        sink.upload(record, run_id)
        return run_id
    except Exception as exc:
        record.update(error=f"{type(exc).__name__}: {exc}")
        if config.strict:
            raise
        uri = sink.tracking_uri if sink is not None else "the tracking server"
        message = (
            f"neuron-mlflow: could not log the profiling window to MLflow at {uri} "
            f"({type(exc).__name__}: {str(exc)[:300]}); it is kept at {record.path} "
            f"(pending). Run `neuron-mlflow sync --local-dir {config.local_dir}` to "
            "upload it later"
        )
        if target.warned:  # one warning per session; the later windows join the log only
            log.info(message)
        else:
            target.warned = True
            log.warning(message)
            with contextlib.suppress(Warning):  # never an exception, even under -W error
                warnings.warn(message, NeuronMlflowWarning, stacklevel=2)
        return None
