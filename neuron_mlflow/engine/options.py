"""Who this process is and where its windows go: one typed :class:`Options`, built once.

Every front end (the decorator, the Lightning and Hugging Face callbacks, ``autolog``) hands
the engine the same record: the configuration, this process's rank and world size, the ranks
that capture, the MLflow run and the job id shared by every rank. :meth:`Options.resolve`
builds it once per process from the config and the environment, with the same policy for all:

- rank and world size: given by the framework, else ``torch.distributed``, else torchrun's
  ``RANK`` / ``WORLD_SIZE``;
- the run: ``MLFLOW_RUN_ID`` when set (``neuron-mlflow run`` sets it for every process it
  starts), else on rank 0 the framework's run (Lightning's ``MLFlowLogger``, Transformers'
  ``MLflowCallback``), else the active run, else a new run; other ranks receive rank 0's
  through ``broadcast`` (a front end's one collective, at set-up, never in a step hook);
- the job id: ``NEURON_MLFLOW_JOB_ID`` when set, else decided by rank 0 and broadcast, so
  that an offline job's ranks sync into one run.

Example:
    >>> import neuron_mlflow as nm
    >>> options = Options.resolve(nm.ProfilerConfig(), rank=0, world_size=1,
    ...                           run=("sqlite:///mlflow.db", "abc"))
    >>> options.run_id, options.captures, options.traces_only, options.upload
    ('abc', True, False, True)
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.environment import rank_and_world_size
from neuron_mlflow.engine.runs import open_run

JOB_ID_ENV = "NEURON_MLFLOW_JOB_ID"
"""The job id every process of a job shares, when a launcher (``neuron-mlflow run``) set it."""

RUN_ID_ENV = "MLFLOW_RUN_ID"
"""MLflow's own variable naming the run to log into (``mlflow.start_run()`` honours it too)."""

Broadcast = Callable[[Any], Any]
"""Rank 0's value to every rank (``value`` is ignored elsewhere): a framework's broadcast."""


@dataclass(frozen=True)
class Options:
    """What a session needs besides its configuration, the same for every front end.

    Attributes:
        config: the effective configuration.
        rank: this process's global rank; ``None``: read from ``torch.distributed`` (or
            torchrun's environment) when a window opens, for a front end made before the
            process group (the decorator).
        world_size: the number of processes of the job (``None`` with ``rank``).
        capture_ranks: the global ranks that capture (``None``: every rank).
        tracking_uri: the tracking server; ``None`` means what MLflow resolves at upload.
        run_id: the run windows go to when no MLflow run is active on the training thread.
        job_id: the job's id, the same on every rank (an offline job's ranks sync into one
            run).
        attached: a front end (:class:`~neuron_mlflow.engine.attach.Attachment`) decided the
            run at set-up (an active MLflow run is not followed) and runs the system metrics
            and the capture-request watcher for the whole job, and each rank logs its own
            times as ``P/rank/<r>/...``; else each session runs its own.

    See the module docstring for an example.
    """

    config: ProfilerConfig
    rank: int | None = None
    world_size: int | None = None
    capture_ranks: frozenset[int] | None = None
    tracking_uri: str | None = None
    run_id: str | None = None
    job_id: str | None = None
    attached: bool = False

    @property
    def captures(self) -> bool:
        """True when this rank captures windows."""
        return self.capture_ranks is None or self.rank in self.capture_ranks

    @property
    def traces_only(self) -> bool:
        """Ranks other than 0 upload only their trace folders (rank 0 logs the rest)."""
        return self.rank not in (None, 0)

    @property
    def upload(self) -> bool:
        """Windows are uploaded (else kept pending): rank 0, or a rank that knows the run."""
        return self.run_id is not None or self.rank in (None, 0)

    def active_run(self) -> str | None:
        """The MLflow run active on the calling thread (call it on the training thread:
        MLflow's active run is per thread); ``None`` for an ``attached`` front end.

        Cheap when the user never imported MLflow: then no run can be active.
        """
        if self.attached or "mlflow" not in sys.modules:
            return None
        import mlflow

        run = mlflow.active_run()
        return run.info.run_id if run is not None else None

    def current_run(self) -> str | None:
        """The run a window ending now goes to, as this thread knows it: the active run
        (:meth:`active_run`), else the given ``run_id`` (the worker decides when neither)."""
        return self.active_run() or self.run_id

    @classmethod
    def resolve(
        cls,
        config: ProfilerConfig,
        *,
        ranks: frozenset[int] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        run: tuple[str | None, str | None] | None = None,
        broadcast: Broadcast | None = None,
    ) -> Options:
        """The options of this process for an attached front end (see the module docstring).

        Args:
            config: the effective configuration.
            ranks: the global ranks that capture (``None``: all).
            rank: this process's global rank (default: ``torch.distributed`` or torchrun's
                environment); ``world_size`` likewise.
            run: ``(tracking_uri, run_id)`` of the framework's own MLflow run, on rank 0.
            broadcast: rank 0's value to every rank (e.g. :func:`torch_broadcast`); without
                it, a job of several processes shares only what the environment gives
                (``MLFLOW_RUN_ID``, ``NEURON_MLFLOW_JOB_ID``).
        """
        rank, world_size = rank_and_world_size(rank, world_size)
        shared = broadcast if broadcast is not None and world_size > 1 else None
        job_id = os.environ.get(JOB_ID_ENV) or None
        if job_id is None:
            mine = uuid.uuid4().hex if rank == 0 else None
            job_id = shared(mine) if shared is not None else mine
        uri: str | None
        run_id: str | None = os.environ.get(RUN_ID_ENV) or None
        if run_id is not None:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        else:
            mine_run = (run or open_run(config)) if rank == 0 else None
            if shared is not None:
                mine_run = shared(mine_run)
            uri, run_id = mine_run or (None, None)
        return cls(
            config,
            rank=rank,
            world_size=world_size,
            capture_ranks=ranks,
            tracking_uri=uri,
            run_id=run_id,
            job_id=job_id,
            attached=True,
        )


def torch_broadcast() -> Broadcast | None:
    """``torch.distributed``'s broadcast from rank 0, when its process group is up (for a
    front end that has no collective of its own: autolog's plain loop)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None

    def broadcast(value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return broadcast
