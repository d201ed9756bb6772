"""The window record: one typed record of a window's whole life, from its end to MLflow.

:class:`Window` is written once, complete, by the training thread when a window ends (it is
the worker's queued job), then is the window's ``manifest.json``; the worker and ``sync`` read
nothing else. Its fields, states (:class:`WindowState`) and how the records of earlier
releases are read (:func:`upgrade`, :mod:`neuron_mlflow.engine.legacy_queue`): docs/spool.md.

Example:
    >>> w = Window(state=WindowState.SPOOLED, artifact_path="profile/step_000001-000002",
    ...            session="s", created="2026-12-04T00:00:00Z", captured_ms=0)
    >>> w.status, w.summarised
    ('pending', False)
    >>> decode_window(encode_window(w), "manifest.json") == w
    True
"""

from __future__ import annotations

import calendar
import enum
import time
from typing import Any, Literal

import msgspec

from neuron_mlflow.config import ProfilerConfig

SCHEMA_VERSION = 3
"""The version of :class:`Window` written now (1: the dict manifests of the first release;
2: the config, environment and errors in ``document``)."""
Status = Literal["pending", "done", "incomplete"]


class WindowState(enum.StrEnum):
    """Where a spooled window is in its life (docs/spool.md)."""

    SPOOLED = "spooled"
    SUMMARISED = "summarised"
    UPLOADED = "uploaded"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class WindowFacts(msgspec.Struct, kw_only=True):
    """Which steps the window holds: its index in the schedule, first and last recorded step,
    and whether it was cut short (``partial``)."""

    index: int
    first: int
    last: int
    partial: bool = False


class UploadedParts(msgspec.Struct, kw_only=True):
    """Which parts MLflow has confirmed."""

    tags: bool = False
    params: bool = False
    metrics: bool = False
    artifacts: bool = False


class UploadProgress(msgspec.Struct, kw_only=True):
    """Exactly-once delivery: the metric chunks confirmed, the one being sent (its fate is
    looked up on the server after a crash), and the artifact files confirmed."""

    metric_chunks: list[int] = msgspec.field(default_factory=list)
    sending: int | None = None
    artifact_files: list[str] = msgspec.field(default_factory=list)


class Window(msgspec.Struct, kw_only=True):
    """One window: what it is, where it goes, what it holds, how far it got.

    Attributes:
        artifact_path: ``P/step_<first>-<last>``: the folder in the spool and in the run.
        session: the session folder it belongs to (directly under the spool's root).
        created: when it ended (UTC, ISO 8601); ``captured_ms`` the metrics' timestamp.
        prefix: the metric prefix ``P``; ``backend`` the backend it was captured with;
            ``trace_dir`` its trace folder under ``artifacts/``.
        facts: its steps (:class:`WindowFacts`); ``steps``/``wall_time_us`` as captured.
        reason: why it was taken (``schedule``, ``request <id>``, ``slow steps: ...``).
        rank, world_size: the process's global rank and the job's size; ``rank_metrics``:
            log ``P/rank/<r>/...``; ``traces_only``: a rank other than 0 (its rank metrics
            and traces only).
        run_id, tracking_uri, experiment_id, experiment_name, run_name, job_id: where it goes;
            ``original_run_id`` the run it was meant for when that run was gone at sync.
        upload_traces: upload the ``traces/`` folder too.
        upload: the worker uploads it after the summary (``False``: it stays pending).
        skew_ranks: rank 0 of a job of several ranks: the ranks whose times its worker
            reads for ``P/rank/max_over_median_time``.
        config: the session's configuration; ``errors`` what went wrong while capturing.
        sources: for an ingested window, each rank's trace file and what it held.
        metric_step: the MLflow step of its metrics; ``metrics``/``params``/``tags`` what it
            logs (the tags: the environment read at the end, with the backend's facts).
        uploaded, progress: exactly-once delivery (:class:`UploadedParts`,
            :class:`UploadProgress`).
        error: what went wrong, if anything; ``failed_step`` where (``summary``, ``upload``).
        handled: the worker process is done with it (whatever the outcome).
        attempts: how often a worker process started on it (a window that kills the
            worker is given up after a few).
    """

    schema_version: int = SCHEMA_VERSION
    state: WindowState
    artifact_path: str
    session: str
    created: str
    captured_ms: int
    prefix: str | None = None
    backend: str | None = None
    trace_dir: str | None = None
    facts: WindowFacts | None = None
    steps: int = 0
    wall_time_us: float = 0.0
    reason: str = "schedule"
    rank: int = 0
    world_size: int = 1
    rank_metrics: bool = False
    traces_only: bool = False
    run_id: str | None = None
    original_run_id: str | None = None
    tracking_uri: str | None = None
    experiment_id: str | None = None
    experiment_name: str | None = None
    run_name: str | None = None
    job_id: str | None = None
    upload_traces: bool = True
    upload: bool = True
    skew_ranks: list[int] | None = None
    config: ProfilerConfig | None = None
    errors: list[str] = msgspec.field(default_factory=list)
    sources: dict[str, Any] = msgspec.field(default_factory=dict)
    metric_step: int = 0
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    params: dict[str, str] = msgspec.field(default_factory=dict)
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    uploaded: UploadedParts = msgspec.field(default_factory=UploadedParts)
    progress: UploadProgress = msgspec.field(default_factory=UploadProgress)
    error: str | None = None
    failed_step: str | None = None
    handled: bool = False
    attempts: int = 0

    @property
    def status(self) -> Status:
        """``pending`` (to upload), ``done`` or ``incomplete``, as ``sync`` sees it."""
        if self.state is WindowState.UPLOADED:
            return "done"
        if self.state is WindowState.INCOMPLETE:
            return "incomplete"
        return "pending"

    @property
    def summarised(self) -> bool:
        """The metrics and summary files are written."""
        return self.state in (WindowState.SUMMARISED, WindowState.UPLOADED) or (
            self.state is WindowState.INCOMPLETE and bool(self.metrics)
        )


def state_from_status(status: str, summarised: bool) -> WindowState:
    """The state of a window the first release saw as ``status`` (``pending``, ``done``,
    ``incomplete``) and ``summarised``."""
    states = {"done": WindowState.UPLOADED, "incomplete": WindowState.INCOMPLETE}
    return states.get(status, WindowState.SUMMARISED if summarised else WindowState.SPOOLED)


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A record of an earlier release as a :class:`Window`'s fields: the first release's
    (``"format": 1``) and ``schema_version`` 2's (``document``: config, environment, errors).

    Example:
        >>> upgrade({"format": 1, "status": "pending", "summarised": True})["state"]
        'summarised'
        >>> upgrade({"schema_version": 2, "document": {"errors": ["x"]}})["errors"]
        ['x']
    """
    if data.get("schema_version") == SCHEMA_VERSION:
        return data
    data = dict(data)
    if data.get("schema_version") is None:  # the first release's
        data.pop("format", None)
        status, summarised = data.pop("status", "pending"), data.pop("summarised", True)
        data["state"] = state_from_status(status, summarised).value
        if "window" in data:
            data["facts"] = data.pop("window")
        stamp = data.get("captured_ms")
        data["captured_ms"] = (
            int(stamp) if isinstance(stamp, int | float) else _created_ms(data.get("created"))
        )
    # ``document``'s typed parts as fields; the rest of it is left out (its ``environment``
    # is the tags)
    document = data.pop("document", None) or {}
    for name, field_name in {"config": "config", "errors": "errors", "ranks": "sources"}.items():
        if document.get(name) is not None:
            data[field_name] = document[name]
    data["schema_version"] = SCHEMA_VERSION
    return data


def _created_ms(created: object) -> int:
    """A first-release window's capture time: its ``created`` stamp, else now."""
    try:
        return calendar.timegm(time.strptime(str(created), "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except ValueError:
        return int(time.time() * 1000)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, ProfilerConfig):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(kind: type, obj: Any) -> Any:
    return ProfilerConfig.model_validate(obj)  # its only such type; msgspec names a bad field


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode_window(window: Window) -> bytes:
    """The record's bytes: one JSON line."""
    return _ENCODER.encode(window) + b"\n"


def decode_window(raw: bytes, where: str) -> Window:
    """Read a manifest (either release's) as a :class:`Window`.

    Raises:
        ValueError: the manifest is not JSON or does not validate; the message names
            ``where`` (the file) and what is wrong. Nothing is deleted.
    """
    try:
        data = msgspec.json.decode(raw)
        if not isinstance(data, dict):
            raise msgspec.ValidationError("expected a JSON object")
        return msgspec.convert(upgrade(data), Window, dec_hook=_dec_hook)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(
            f"the window manifest {where} is not valid ({exc}); it is left as it is: fix or "
            "remove that window folder, or re-ingest its traces with `neuron-mlflow ingest`"
        ) from exc


def window_view(window: Window) -> dict[str, Any]:
    """The record as plain JSON data, with ``status``, ``summarised`` and ``window`` (the
    facts) as the first release named them: for readers of plain data (report headers)."""
    data: dict[str, Any] = msgspec.to_builtins(window, enc_hook=_enc_hook)
    data["status"] = window.status
    data["summarised"] = window.summarised
    data["window"] = data.get("facts")
    return data
