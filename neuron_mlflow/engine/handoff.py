"""Handing a spooled window to the worker process, and reading back what it finished.

The session calls :func:`hand_off` once a window is in the spool: a job file in the spool's
queue (:class:`~neuron_mlflow.engine.worker.WorkerClient`), nothing more on the training
thread. The worker process writes its outcome into the window's manifest; :class:`Results`
reads it from there only when the user asks (``prof.summary`` waits for the summary,
``prof.run_id`` for the upload), and reports a failure of the worker once, in this process.

Example:
    >>> Results().wait(1.0, strict=True)
    True
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from neuron_mlflow.engine.guard import report
from neuron_mlflow.engine.worker import Job, WorkerClient
from neuron_mlflow.errors import NeuronMlflowError
from neuron_mlflow.sinks.spool import WindowRecord
from neuron_mlflow.summary.ops import OpSummary, summary_from_dict

RESPAWN_CHECK_S = 1.0
"""While waiting, how often the wait checks that a worker still serves the queue."""


@dataclass
class _Handed:
    """One window handed to the worker, and what this process has read of it."""

    path: Path
    upload: bool
    summary: OpSummary | None = None
    record: WindowRecord | None = None
    finished: bool = False
    reported: bool = False


@dataclass
class Results:
    """A session's windows handed to the worker process, read back from the spool.

    Nothing here runs unless the user (or ``close()``) asks: the training thread never waits.
    """

    client: WorkerClient | None = None
    handed: list[_Handed] = field(default_factory=list)

    def hand_off(self, record: WindowRecord, job: Job) -> None:
        """Queue the spooled ``record`` for the worker (``job`` says what to do with it)."""
        assert self.client is not None
        self.handed.append(_Handed(record.path, job.upload))
        self.client.submit(job)

    def _read(self, handed: _Handed, summaries_only: bool) -> bool:
        """Read the window's manifest; True when the worker is done with what we wait for."""
        if handed.finished:
            return True
        try:
            record = WindowRecord.load(handed.path)
        except (OSError, ValueError):
            return False  # being written (atomically replaced): read it again
        manifest = record.manifest
        if handed.summary is None and manifest.get("summarised"):
            try:
                data = json.loads((record.artifacts_dir / "summary.json").read_text("utf-8"))
                handed.summary = summary_from_dict(data["summary"])
                handed.record = record
            except (OSError, ValueError, KeyError):
                return False
        if manifest.get("handled"):
            handed.record = record
            handed.finished = True
            return True
        return summaries_only and handed.summary is not None

    def wait(self, timeout_s: float, strict: bool, summaries_only: bool = False) -> bool:
        """Wait (at most ``timeout_s``) for the handed windows; True when none is left.

        With ``summaries_only`` wait until each window is summarised, not for its upload. A
        failure of the worker is reported once (a warning), or raised when ``strict``.
        """
        deadline = time.monotonic() + timeout_s
        next_check = time.monotonic() + RESPAWN_CHECK_S
        for handed in self.handed:
            while not self._read(handed, summaries_only):
                now = time.monotonic()
                if now >= deadline:
                    return False
                if now >= next_check and self.client is not None:
                    self.client.ensure_running()  # a worker that died is started again
                    next_check = now + RESPAWN_CHECK_S
                time.sleep(min(0.005, max(0.0, deadline - now)))
            self._report(handed, strict)
        return True

    def _report(self, handed: _Handed, strict: bool) -> None:
        record = handed.record
        if not handed.finished or handed.reported or record is None:
            return
        handed.reported = True
        error = record.manifest.get("error")
        step = record.manifest.get("failed_step")
        if not error or step is None:
            return
        if strict:
            raise NeuronMlflowError(f"neuron-mlflow: {error}")
        if step == "upload":
            local_dir = self.client.root if self.client is not None else record.path.parent
            report(
                f"neuron-mlflow: {error}; it is kept at {record.path} (pending). Run "
                f"`neuron-mlflow sync --local-dir {local_dir}` to upload it later"
            )
        else:
            report(f"neuron-mlflow: {error}")

    def close(self) -> None:
        """This process hands no more windows (the worker finishes the queue, then exits)."""
        if self.client is not None:
            self.client.close()

    @property
    def summary(self) -> OpSummary | None:
        """The summary of the last window summarised so far."""
        summaries = [h.summary for h in self.handed if h.summary is not None]
        return summaries[-1] if summaries else None

    @property
    def records(self) -> list[WindowRecord]:
        """The handed windows read back so far (summarised), oldest first."""
        return [h.record for h in self.handed if h.record is not None and h.summary is not None]

    @property
    def run_id(self) -> str | None:
        """The run the last uploaded window went to."""
        for handed in reversed(self.handed):
            if handed.record is not None and handed.record.status == "done":
                run = handed.record.manifest.get("run_id")
                if run:
                    return str(run)
        return None
