"""Queued jobs of schema 2 (the window's end facts; its record drafted in ``draft.json``),
completed into records as that release did, so its spool still syncs (docs/spool.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from neuron_mlflow.engine.host_load import HostLoad, host_load_tags
from neuron_mlflow.naming import partial_tag, reason_tag
from neuron_mlflow.sinks.spool import WindowRecord
from neuron_mlflow.sinks.window_record import Window, WindowFacts, WindowState, decode_window

DRAFT = "draft.json"
"""A live window's record as that release drafted it when the window opened."""


def legacy_job(root: Path, raw: bytes, where: str) -> Window:
    """The record of a job file of the release before (``where`` names it in errors).

    Raises:
        OSError: the window is neither staged (with its draft) nor in place.
        ValueError: the job or its draft is not valid.
    """
    try:
        job = msgspec.json.decode(raw)
        if not isinstance(job, dict) or not isinstance(job.get("window"), str):
            raise msgspec.ValidationError("expected a job object naming its window")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"the job {where} is not valid ({exc})") from exc
    skew = job.get("skew") or {}
    extra = {"upload": bool(job.get("upload", True)), "skew_ranks": skew.get("ranks")}
    end, staged = job.get("end"), job.get("staged")
    draft = root / str(staged) / DRAFT
    if end is None or staged is None or not draft.is_file():  # in place already
        return msgspec.structs.replace(WindowRecord.load(root / job["window"]).window, **extra)
    window = decode_window(draft.read_bytes(), str(draft))
    artifact_path = str(end["artifact_path"])  # the draft completed as that release did
    tags = dict(end.get("environment") or {})
    opened, ended = end.get("host_load_open"), end.get("host_load_end")
    if opened is not None and ended is not None:
        tags.update(
            host_load_tags(msgspec.convert(opened, HostLoad), msgspec.convert(ended, HostLoad))
        )
    tags[reason_tag(artifact_path)] = end.get("reason", "schedule")
    if end.get("partial"):
        tags[partial_tag(artifact_path)] = "true"
    errors = list(end.get("errors") or [])
    captured_ms = int(end["captured_ms"])
    return msgspec.structs.replace(
        window,
        state=WindowState.INCOMPLETE if end.get("status") == "incomplete" else WindowState.SPOOLED,
        artifact_path=artifact_path,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(captured_ms / 1000)),
        captured_ms=captured_ms,
        facts=WindowFacts(
            index=end["index"], first=end["first"], last=end["last"], partial=end["partial"]
        ),
        steps=end["steps"],
        wall_time_us=end["wall_time_us"],
        run_id=end.get("run_id"),
        tracking_uri=end.get("tracking_uri"),
        experiment_id=end.get("experiment_id"),
        metric_step=end["metric_step"],
        tags=tags,
        errors=errors,
        error="; ".join(errors) or None,
        **extra,
    )
