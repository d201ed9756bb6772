"""What the training thread knows when a window ends, and how it completes the window's record.

The step that ends a window stops the profiler (its backend writes the trace) and then
notes :class:`EndFacts`: which steps were recorded and how long they took, the status, the
errors, the run the window goes to, the environment and host-load samples. Nothing more runs
there. The facts travel in the worker's job (:class:`~neuron_mlflow.engine.worker.Job`);
the worker process (or ``sync``, when no worker got to it) completes the record drafted when
the window opened with :func:`complete_window` and puts the window in place. A window ended
by an exception, a stage's end or a signal is completed the same way, on the spot.

Example:
    >>> from neuron_mlflow.sinks.window_record import Window, WindowState
    >>> draft = Window(state=WindowState.SPOOLED, artifact_path="", session="s",
    ...                created="", captured_ms=0, prefix="profile")
    >>> facts = EndFacts(status="pending", partial=False, errors=[], index=0, first=1,
    ...                  last=2, steps=2, wall_time_us=1500.0,
    ...                  artifact_path="profile/step_000001-000002", captured_ms=0,
    ...                  metric_step=2, reason="schedule")
    >>> window = complete_window(draft, facts)
    >>> window.artifact_path, window.steps, window.created
    ('profile/step_000001-000002', 2, '1970-01-01T00:00:00Z')
"""

from __future__ import annotations

import time

import msgspec

from neuron_mlflow.engine.host_load import HostLoad, host_load_tags
from neuron_mlflow.naming import partial_tag, reason_tag
from neuron_mlflow.sinks.window_record import Window, WindowFacts, WindowState

__all__ = ["EndFacts", "complete_window"]


class EndFacts(msgspec.Struct, kw_only=True, frozen=True):
    """A window's facts as its last step ends (on the training thread; no MLflow call).

    Attributes:
        status: ``pending`` (ended by its schedule or a stage's end) or ``incomplete``
            (the user's step raised).
        partial: it ended before its last scheduled step.
        errors: what went wrong while capturing (the trace export, the user's exception).
        index, first, last: the window's index in the schedule and its recorded steps.
        steps: recorded steps; ``wall_time_us`` their wall time.
        artifact_path: ``P/step_<first>-<last>``, its place in the spool and in the run.
        captured_ms: when it ended (Unix ms; the metrics' timestamp).
        metric_step: the MLflow step of its metrics.
        run_id: the run decided without asking MLflow (active, explicit or our own).
        tracking_uri: the server; ``experiment_id`` the experiment set in the process.
        environment: the environment tags, read at the end (a backend's facts can change
            once its profiler has run).
        host_load_open, host_load_end: the host-load samples at the open and the end.
        reason: why the window was captured (``schedule``, a request, a trigger).
    """

    status: str
    partial: bool
    errors: list[str]
    index: int
    first: int
    last: int
    steps: int
    wall_time_us: float
    artifact_path: str
    captured_ms: int
    metric_step: int
    reason: str
    run_id: str | None = None
    tracking_uri: str | None = None
    experiment_id: str | None = None
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    host_load_open: HostLoad | None = None
    host_load_end: HostLoad | None = None


def complete_window(window: Window, facts: EndFacts) -> Window:
    """Complete the record drafted when the window opened with its end ``facts``: state
    ``spooled`` (or ``incomplete``), its place, steps, times, run and tags. Returns
    ``window`` (changed in place)."""
    tags = dict(facts.environment)
    if facts.host_load_open is not None and facts.host_load_end is not None:
        tags.update(host_load_tags(facts.host_load_open, facts.host_load_end))
    tags[reason_tag(facts.artifact_path)] = facts.reason
    if facts.partial:
        tags[partial_tag(facts.artifact_path)] = "true"
    window.document["environment"] = dict(tags)
    window.document["errors"] = list(facts.errors)
    window.state = WindowState.INCOMPLETE if facts.status == "incomplete" else WindowState.SPOOLED
    window.artifact_path = facts.artifact_path
    window.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(facts.captured_ms / 1000))
    window.captured_ms = facts.captured_ms
    window.facts = WindowFacts(
        index=facts.index, first=facts.first, last=facts.last, partial=facts.partial
    )
    window.steps = facts.steps
    window.wall_time_us = facts.wall_time_us
    window.run_id = facts.run_id
    window.tracking_uri = facts.tracking_uri
    window.experiment_id = facts.experiment_id
    window.metric_step = facts.metric_step
    window.tags = tags
    window.error = "; ".join(facts.errors) or None
    return window
