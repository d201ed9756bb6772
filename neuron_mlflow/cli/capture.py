"""``neuron-mlflow capture RUN_ID``: ask a running job for a window, and wait for it.

The request is the run tag ``neuron_mlflow.capture.request``, read by the job within its
``poll_s`` (:mod:`neuron_mlflow.engine.capture_requests`); it starts on :func:`start_step`
unless ``--at-step`` says otherwise. The protocol and the exit codes: docs/on-demand.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import uuid
from typing import Any

from neuron_mlflow.cli.app import EXIT_FAILURE, EXIT_USAGE, fail, mlflow_failed, reading_mlflow
from neuron_mlflow.engine.capture_requests import status_request_id
from neuron_mlflow.naming import CAPTURE_REQUEST_TAG, capture_status_tag

EXIT_DONE = 0
EXIT_REFUSED = 3
EXIT_TIMEOUT = 4

HEARTBEAT_PREFIX = "neuron_mlflow.capture.heartbeat.rank."
STALE_POLLS = 10
STALE_S = 60.0
"""A heartbeat older than ``STALE_POLLS x poll_s`` (and ``STALE_S``): its job has ended."""


def heartbeats(tags: dict[str, str]) -> dict[int, dict[str, Any]]:
    """Each rank's last heartbeat, read from the run's tags (unreadable ones left out).

    Example:
        >>> heartbeats({"neuron_mlflow.capture.heartbeat.rank.1": '{"step": 7}', "x": "y"})
        {1: {'step': 7}}
    """
    beats: dict[int, dict[str, Any]] = {}
    for key, value in tags.items():
        if key.startswith(HEARTBEAT_PREFIX):
            with contextlib.suppress(ValueError):
                beats[int(key.removeprefix(HEARTBEAT_PREFIX))] = json.loads(value)
    return beats


def start_step(beats: dict[int, dict[str, Any]], roundup: int, now: float) -> int | None:
    """The step every rank can start on: the furthest rank's step now (extrapolated from its
    heartbeat) plus ``2 x poll_s`` worth of steps, rounded up to a multiple of ``roundup``.

    Example:
        >>> start_step({0: {"step": 95, "steps_per_s": 2.0, "poll_s": 1.0, "time": 100.0}},
        ...            10, now=100.0)
        100
    """
    if not beats:
        return None
    steps_now = []
    lead = 0.0
    for beat in beats.values():
        rate = float(beat.get("steps_per_s") or 0.0)
        poll_s = float(beat.get("poll_s") or 0.0)
        age = max(0.0, now - float(beat.get("time") or now))
        steps_now.append(int(beat.get("step") or 0) + rate * age)
        lead = max(lead, 2 * poll_s * rate)
    target = max(steps_now) + lead
    return int(math.ceil(target / roundup) * roundup)


def not_running(status: str, beats: dict[int, dict[str, Any]], now: float) -> str | None:
    """Why a run cannot take a request (it has ended, or its heartbeats are stale), or None; a
    run with no heartbeat yet may still be starting.

    Example:
        >>> not_running("RUNNING", {0: {"poll_s": 1.0, "time": 100.0}}, now=190.0)
        'status RUNNING, last heartbeat 90 s ago'
        >>> not_running("KILLED", {}, now=0.0), not_running("RUNNING", {}, now=0.0)
        ('status KILLED, no heartbeat', None)
    """
    ended = status in ("FINISHED", "FAILED", "KILLED")
    if not beats:
        return f"status {status}, no heartbeat" if ended else None
    age = now - max(float(b.get("time") or 0.0) for b in beats.values())
    poll_s = max(float(b.get("poll_s") or 0.0) for b in beats.values())
    if ended or age > max(STALE_POLLS * poll_s, STALE_S):
        return f"status {status}, last heartbeat {age:.0f} s ago"
    return None


def _get_run(client: Any, run_id: str) -> Any | None:
    """The run, or None when MLflow hiccups (said on stderr; the caller asks again)."""
    try:
        return client.get_run(run_id)
    except Exception as exc:
        print(f"  (MLflow: {type(exc).__name__}; trying again)", file=sys.stderr)
        return None


def _next_heartbeats(
    client: Any, run_id: str, beats: dict[int, dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Wait (at most 2 x poll_s) for heartbeats that carry a step rate; a server that hiccups
    is asked again until then, and then the beats at hand are used."""
    poll_s = max(float(b.get("poll_s") or 0.0) for b in beats.values())
    deadline = time.monotonic() + 2 * poll_s
    while time.monotonic() < deadline:
        time.sleep(min(0.25, poll_s / 2))
        run = _get_run(client, run_id)
        fresh = heartbeats(run.data.tags) if run is not None else {}
        if any(b.get("steps_per_s") for b in fresh.values()):
            return fresh
    return beats


def run_capture(args: argparse.Namespace) -> int:
    """The ``capture`` verb (see the module docstring)."""
    for name, low in (("steps", 1), ("warmup", 0), ("at_step", 0), ("roundup", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            flag = "--" + name.replace("_", "-")
            return fail("capture", f"{flag}={value}: need >= {low}", EXIT_USAGE)
    return reading_mlflow("capture", lambda client: _capture(client, args))


def _capture(client: Any, args: argparse.Namespace) -> int:
    from neuron_mlflow.sinks.profiles import is_not_found

    try:
        run = client.get_run(args.run_id)
    except Exception as exc:
        if not is_not_found(exc):
            return mlflow_failed("capture", exc)
        unknown = f"run {args.run_id!r} was not found at {client.tracking_uri}"
        return fail("capture", unknown, EXIT_USAGE)
    beats = heartbeats(run.data.tags)
    why_not = not_running(run.info.status, beats, time.time())
    if why_not is not None:
        why_not = f"run {args.run_id} is not running ({why_not}): it cannot take a request"
        return fail("capture", why_not, EXIT_USAGE)
    if args.at_step is None and beats and not any(b.get("steps_per_s") for b in beats.values()):
        beats = _next_heartbeats(client, args.run_id, beats)  # a first beat has no rate yet
    at_step = args.at_step
    if at_step is None:
        at_step = start_step(beats, args.roundup, time.time())
    request_id = uuid.uuid4().hex[:12]
    asked = {"steps": args.steps, "warmup": args.warmup, "at_step": at_step}
    request = {"id": request_id, **{k: v for k, v in asked.items() if v is not None}}
    try:
        client.set_tag(args.run_id, CAPTURE_REQUEST_TAG, json.dumps(request))
    except Exception as exc:
        return fail("capture", f"cannot write the request: {exc}", EXIT_FAILURE)
    where = f"from step {at_step}" if at_step is not None else "at the next step (no heartbeat)"
    print(f"request {request_id}: {json.dumps(request)} -> run {args.run_id} ({where})")
    if not args.wait:
        return EXIT_DONE
    return _wait(client, args, request_id, sorted(beats) or [0])


def _wait(client: Any, args: argparse.Namespace, request_id: str, ranks: list[int]) -> int:
    deadline = time.monotonic() + args.timeout
    said: dict[int, str] = {}
    while True:
        run = _get_run(client, args.run_id)  # a server that hiccups: asked until the deadline
        if run is not None:
            tags = run.data.tags
            answers = {}
            for rank in ranks:
                status = tags.get(capture_status_tag(rank), "")
                if status_request_id(status) == request_id:
                    answers[rank] = status
                    if said.get(rank) != status:
                        said[rank] = status
                        print(f"rank {rank}: {status}")
            if any(s.startswith("refused") for s in answers.values()):
                return EXIT_REFUSED
            if any(s.startswith("failed") for s in answers.values()):
                return EXIT_FAILURE
            done = {r: s for r, s in answers.items() if s.startswith("done")}
            if len(done) == len(ranks):
                _print_done(run, done)
                return EXIT_DONE
        if time.monotonic() >= deadline:
            last = ", ".join(
                f"rank {r} said {said[r].rsplit(' (request ', 1)[0]!r}"
                if r in said
                else f"rank {r} said nothing"
                for r in ranks
            )
            return fail(
                "capture",
                f"no final answer within {args.timeout:g} s ({last}); the request stays in the run",
                EXIT_TIMEOUT,
            )
        time.sleep(args.interval)


def _print_done(run: Any, done: dict[int, str]) -> None:
    import mlflow

    status = done[min(done)]
    path = status.split("done: ", 1)[1].rsplit(" (request ", 1)[0]
    artifact = path.split("/", 2)[2] if path.startswith("runs:/") else path
    prefix = artifact.rsplit("/step_", 1)[0]
    steps = run.data.metrics.get(f"{prefix}/steps")
    shown = f" ({steps:g} steps)" if steps is not None else ""
    print(f"window {artifact}{shown} in run {run.info.run_id}: {path}")
    uri = mlflow.get_tracking_uri()
    if uri.startswith("http"):
        print(
            f"report: {uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
            f"/artifacts/{artifact}/report.html"
        )
