"""Windows on demand: capture requests read while the job runs, and slow steps that ask.

A background thread reads the run's tag and ``<local_dir>/capture`` every ``poll_s`` and sends
every answer; a signal's handler only sets a flag. The training thread checks
:attr:`OnDemand.hot` at a step begin and takes the requests there (``request_window`` mutates
session state). The protocol and what it costs: ``docs/on-demand.md``.

Example:
    >>> parse_request('{"steps": 3, "id": "a1"}', "tag", max_steps=50)
    CaptureRequest(id='a1', steps=3, warmup=None, at_step=None, source='tag')
    >>> try:
    ...     parse_request('{"steps": 500}', "tag", max_steps=50)
    ... except BadRequest as err:
    ...     print(err)
    steps=500 is above max_request_steps=50
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.slow_steps import SlowStepDetector
from neuron_mlflow.errors import BadRequest, WindowRequestRefused
from neuron_mlflow.naming import (
    CAPTURE_FILE,
    CAPTURE_REQUEST_TAG,
    STEP_TIME_METRIC,
    capture_status_tag,
    heartbeat_tag,
    window_artifact_path,
)
from neuron_mlflow.schedule import Window

log = logging.getLogger("neuron_mlflow")

REQUEST_KEYS = ("id", "steps", "warmup", "at_step")

ROUNDUP = 10
"""Without ``at_step``, a job of several ranks starts at a multiple of this (all ranks alike)."""

STOP_S = 1.0
"""How long :meth:`OnDemand.close` waits for a poll under way when no answer is left to give
(the thread itself is waiting between polls: it stops at once)."""

_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_STATUS_ID = re.compile(r"\(request ([A-Za-z0-9_.:\-]{1,64})\)\s*$")


@dataclass(frozen=True)
class CaptureRequest:
    """One request for a window (``None``: the default)."""

    id: str
    steps: int | None = None
    warmup: int | None = None
    at_step: int | None = None
    source: str = "tag"


def _count(data: dict[str, Any], key: str, low: int, high: int | None) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is not a whole number")
    if value < low:
        raise ValueError(f"{key}={value} is below {low}")
    if high is not None and value > high:
        raise ValueError(f"{key}={value} is above max_request_steps={high}")
    return value


def parse_request(text: str, source: str, max_steps: int, id_salt: str = "") -> CaptureRequest:
    """Read a request (JSON object, or empty text for the defaults); one without an id gets
    ``<source>-<digest of the text and id_salt>``.

    Raises:
        BadRequest: not a valid request (the message says why; ``request_id`` is its id).
    """
    fallback = f"{source}-{hashlib.sha1((text + id_salt).encode()).hexdigest()[:8]}"
    stripped = text.strip()
    if not stripped:
        return CaptureRequest(fallback, source=source)
    try:
        data = json.loads(stripped)
    except ValueError as exc:
        raise BadRequest(f"malformed JSON ({exc}): {stripped[:80]!r}", fallback) from None
    if not isinstance(data, dict):
        raise BadRequest(f"expected a JSON object, got {stripped[:80]!r}", fallback)
    raw_id = data.get("id")
    request_id = raw_id if isinstance(raw_id, str) and _ID.match(raw_id) else fallback
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise BadRequest(
            f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REQUEST_KEYS)}",
            request_id,
        )
    if raw_id is not None and request_id != raw_id:
        raise BadRequest(f"id={raw_id!r}: expected 1-64 letters, digits or _.:-", request_id)
    try:
        steps = _count(data, "steps", 1, max_steps)
        warmup = _count(data, "warmup", 0, max_steps)
        at_step = _count(data, "at_step", 0, None)
    except ValueError as exc:
        raise BadRequest(str(exc), request_id) from None
    return CaptureRequest(request_id, steps, warmup, at_step, source)


def status_request_id(status: str) -> str | None:
    """The request id a status line answers.

    Example:
        >>> status_request_id("refused: step 3 is past (request 9f2c)")
        '9f2c'
    """
    found = _STATUS_ID.search(status or "")
    return found.group(1) if found else None


# -- the signal ------------------------------------------------------------------------

_signal_targets: list[OnDemand] = []
_installed: dict[int, Any] = {}


def _on_signal(signum: int, frame: Any) -> None:
    for target in list(_signal_targets):
        target.signalled = True
        target.hot = True


def _install_signal(name: str | None, target: OnDemand) -> None:
    """Route ``name`` to ``target`` when the job has no handler of its own (main thread)."""
    if name is None or threading.current_thread() is not threading.main_thread():
        return
    signum = getattr(signal, name)
    with contextlib.suppress(ValueError, OSError):
        current = signal.getsignal(signum)
        if current is _on_signal or current in (signal.SIG_DFL, None):
            if current is not _on_signal:
                _installed[signum] = current
                signal.signal(signum, _on_signal)
            _signal_targets.append(target)
            return
        log.info("neuron-mlflow: %s has a handler of the job's own; capture by signal is off", name)


def _uninstall_signal(target: OnDemand) -> None:
    with contextlib.suppress(ValueError):
        _signal_targets.remove(target)
    if _signal_targets or threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_installed.items()):
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        _installed.pop(signum, None)


# -- the per-rank watcher ----------------------------------------------------------------


class OnDemand:
    """Requests and the slow-step trigger of one front end on one rank (see module doc).

    Args:
        request: ``request_window(steps, warmup, start, reason)``; raises
            ``WindowRequestRefused``.
        busy: True while a window is open.
        current_step: the number of the next step (read by the background thread).
        run: the run to poll (``None`` while unknown).
    """

    def __init__(
        self,
        config: ProfilerConfig,
        prefix: str,
        *,
        rank: int,
        world_size: int,
        request: Callable[[int, int, int | None, str], Window],
        busy: Callable[[], bool],
        current_step: Callable[[], int],
        run: Callable[[], str | None],
        tracking_uri: str | None = None,
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        self._request = request
        self._busy = busy
        self._current_step = current_step
        self._run = run
        self._tracking_uri = tracking_uri
        self._local_dir = Path(config.local_dir).absolute()
        self.detector = SlowStepDetector(config.trigger) if config.trigger is not None else None
        self.hot = self.detector is not None
        """Checked at each step begin: something waits for the training thread."""
        self.signalled = False
        self._inbox: deque[CaptureRequest] = deque()
        self._outbox: deque[str] = deque()  # status lines for MLflow
        self._file_out: deque[str] = deque()  # the same, for the status file
        self._accepted: deque[tuple[str, str]] = deque()  # (request id, artifact path)
        self._waiting_said: set[str] = set()
        self._signal_count = 0
        self._last_step: int | None = None
        self._last_t = 0.0
        self._last_busy = True
        self._seen: set[str] = set()  # request ids (the poll thread's only)
        self._tag_value: str | None = None
        self._file_key: tuple[int, int] | None = None
        self._started_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._first_poll = True
        self._beat: tuple[int, float] | None = None

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> OnDemand | None:
        """Install the signal handler (main thread) and start the background thread; ``None``
        when the config asks for nothing on demand (no polling, no trigger, no signal)."""
        config = self.config
        if config.poll_s <= 0 and config.trigger is None and config.capture_signal is None:
            return None
        _install_signal(config.capture_signal, self)
        if config.poll_s > 0:
            self._thread = threading.Thread(
                target=self._loop, name=f"neuron-mlflow-capture-{self.rank}", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Put the signal's previous handler back and stop the background thread after one
        last poll; waits at most 10 s for answers to give, else :data:`STOP_S`."""
        _uninstall_signal(self)
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0 if self._pending() else STOP_S)

    @property
    def awaiting_windows(self) -> bool:
        """A request was accepted and its window not answered ``done`` yet (the end of a
        session waits for the window's upload, bounded, before :meth:`close`)."""
        return bool(self._accepted)

    def _pending(self) -> bool:
        """Answers still to give (a request taken, not yet done; an answer not yet sent)."""
        return bool(self._accepted or self._outbox or self._inbox or self._file_out)

    # -- the training thread --------------------------------------------------------

    def tick(self, step: int) -> None:
        """Step ``step`` begins (called only while :attr:`hot`): time the step for the
        trigger, take queued requests. Never raises."""
        try:
            detector = self.detector
            if detector is not None:
                now = time.perf_counter()
                busy = self._busy()
                if self._last_step == step - 1 and not busy and not self._last_busy:
                    ratio = detector.add(step - 1, now - self._last_t)
                    if ratio is not None:
                        self._trigger(step, ratio)
                        busy = self._busy()
                self._last_step, self._last_t, self._last_busy = step, now, busy
            if self.signalled:
                self.signalled = False
                self._signal_count += 1
                name = self.config.capture_signal or "signal"
                self._inbox.append(
                    CaptureRequest(f"{name.lower()}-{self._signal_count}", source="signal")
                )
            if self._inbox:
                self._take(step)
            if detector is None:
                self.hot = False
                if self._inbox or self.signalled:
                    self.hot = True
        except Exception as exc:  # never an exception in the job
            log.warning("neuron-mlflow: capture request handling failed: %s", exc)

    def _trigger(self, step: int, ratio: float) -> None:
        schedule = self.config.schedule
        reason = f"slow steps: {ratio:.1f}x median"
        try:
            window = self._request(schedule.active, schedule.warmup, step, reason)
        except WindowRequestRefused as exc:
            assert self.detector is not None
            self.detector.refused()
            log.info("neuron-mlflow: %s, but no window: %s", reason, exc)
            return
        log.warning(
            "neuron-mlflow: %s at step %d: profiling steps %d-%d", reason, step, window.first,
            window.last,
        )  # fmt: skip

    def _answer(self, request_id: str, status: str) -> None:
        line = f"{status} (request {request_id})"
        self._outbox.append(line)
        self._file_out.append(line)
        if status.startswith("refused"):
            log.warning("neuron-mlflow: capture request %s %s", request_id, status)

    def _take(self, step: int) -> None:
        while self._inbox:
            request = self._inbox[0]
            if self._busy():
                if request.id not in self._waiting_said:
                    self._waiting_said.add(request.id)
                    self._answer(request.id, "waiting: a window is open; it starts after it")
                return
            self._inbox.popleft()
            schedule = self.config.schedule
            steps = schedule.active if request.steps is None else request.steps
            warmup = schedule.warmup if request.warmup is None else request.warmup
            start = request.at_step
            if start is None:
                start = step
                if self.world_size > 1:  # every rank on the same multiple, no collective
                    start = math.ceil((step + 1) / ROUNDUP) * ROUNDUP
            try:
                window = self._request(steps, warmup, start, f"request {request.id}")
            except WindowRequestRefused as exc:
                self._answer(request.id, f"refused: {exc}")
                continue
            path = window_artifact_path(self.prefix, window.first, window.last)
            self._accepted.append((request.id, path))
            self._answer(
                request.id,
                f"accepted: steps {window.first}-{window.last} (warm-up from step "
                f"{window.start}) -> {path}",
            )

    # -- the background thread ------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.config.poll_s):
            self.poll()
        if self._pending():
            self.poll()  # the last answers (done) go out before the job ends

    def poll(self) -> None:
        """One round: read the file and the run's tag, write answers, heartbeat, step time."""
        try:
            self._read_file()
            self._check_done()
            self._talk_to_mlflow()
        except Exception as exc:  # never an exception in the job
            log.debug("neuron-mlflow: capture poll failed: %s", exc)

    def _receive(self, text: str, source: str, id_salt: str = "") -> None:
        """Queue a request read from the file or the tag, or refuse it; once per id."""
        try:
            request = parse_request(text, source, self.config.max_request_steps, id_salt)
        except BadRequest as exc:
            if self._first_sight(exc.request_id):
                self._answer(exc.request_id, f"refused: {exc}")
            return
        if self._first_sight(request.id):
            self._inbox.append(request)
            self.hot = True

    def _first_sight(self, request_id: str) -> bool:
        seen = request_id in self._seen
        self._seen.add(request_id)
        return not seen

    def _read_file(self) -> None:
        path = self._local_dir / CAPTURE_FILE
        try:
            stat = path.stat()
        except OSError:
            return
        key = (stat.st_mtime_ns, stat.st_size)
        if key == self._file_key:
            return
        self._file_key = key
        if stat.st_mtime_ns < self._started_ns:
            log.info("neuron-mlflow: %s is older than this job: ignored", path)
            return
        try:
            text = path.read_text("utf-8", errors="replace")
        except OSError:
            self._file_key = None
            return
        self._receive(text, "file", str(stat.st_mtime_ns))

    def _check_done(self) -> None:
        from neuron_mlflow.sinks.spool import MANIFEST, WindowRecord

        for accepted in list(self._accepted):
            request_id, artifact_path = accepted
            for manifest_path in self._local_dir.glob(f"*/{artifact_path}/{MANIFEST}"):
                try:
                    record = WindowRecord.load(manifest_path.parent)
                except (OSError, ValueError):
                    continue
                window = record.window
                if window.reason != f"request {request_id}":
                    continue
                if record.status == "done" and window.run_id:
                    answer = f"done: runs:/{window.run_id}/{artifact_path}"
                elif record.status == "incomplete":
                    answer = f"failed: {window.error or 'incomplete'}"
                elif window.handled:
                    answer = (
                        f"failed: {window.error}" if window.error and window.failed_step != "upload"
                        else f"done: {artifact_path} kept in {record.path} (not "
                        "uploaded: `neuron-mlflow sync` sends it)"
                    )  # fmt: skip
                else:
                    continue
                self._accepted.remove(accepted)
                self._answer(request_id, answer)
                break

    def _write_status_files(self) -> None:
        statuses = []
        while self._file_out:
            statuses.append(self._file_out.popleft())
        if not statuses:
            return
        path = self._local_dir / f"{CAPTURE_FILE}.status.rank.{self.rank}"
        with contextlib.suppress(OSError):
            self._local_dir.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                out.write("".join(f"{s}\n" for s in statuses))

    def _heartbeat(self) -> tuple[int, float, float | None]:
        """The step now, the steps per second and seconds per step since the last poll."""
        step, now = self._current_step(), time.time()
        previous, self._beat = self._beat, (step, now)
        if previous is None:
            return step, 0.0, None
        rate = max(0.0, (step - previous[0]) / (now - previous[1])) if now > previous[1] else 0.0
        step_time = (now - previous[1]) / (step - previous[0]) if step > previous[0] else None
        return step, rate, step_time

    def _talk_to_mlflow(self) -> None:
        self._write_status_files()
        step, rate, step_time = self._heartbeat()
        run_id = self._run()
        if run_id is None:
            return
        import mlflow
        from mlflow.entities import Metric, RunTag

        from neuron_mlflow.sinks.reachability import bounded_http, check_reachable, forget

        uri = self._tracking_uri or mlflow.get_tracking_uri()
        try:
            check_reachable(uri)
        except ConnectionError:
            return  # the answers wait in the outbox until the server is back
        if self._client is None:
            self._client = mlflow.MlflowClient(uri)
        client = self._client
        try:
            with bounded_http():
                tags = client.get_run(run_id).data.tags
                if self._first_poll:  # a job resumed in its run: requests answered before
                    self._first_poll = False
                    answered = status_request_id(tags.get(capture_status_tag(self.rank), ""))
                    if answered is not None and not self._outbox:
                        self._seen.add(answered)
                value = tags.get(CAPTURE_REQUEST_TAG)
                if value is not None and value != self._tag_value:
                    self._tag_value = value
                    self._receive(value, "tag")
                    self._write_status_files()  # a refusal: in the file at once
                statuses = []
                while self._outbox:
                    statuses.append(self._outbox.popleft())
                beat = json.dumps(
                    {"step": step, "steps_per_s": round(rate, 3), "poll_s": self.config.poll_s,
                     "time": round(time.time(), 3)}
                )  # fmt: skip
                batch_tags = [RunTag(heartbeat_tag(self.rank), beat)]
                if statuses:
                    batch_tags.append(RunTag(capture_status_tag(self.rank), statuses[-1]))
                metrics = []
                if self.rank == 0 and step_time is not None:
                    metrics.append(
                        Metric(STEP_TIME_METRIC, step_time, int(time.time() * 1000), step)
                    )
                try:
                    client.log_batch(run_id, metrics=metrics, tags=batch_tags)
                except Exception:
                    self._outbox.extendleft(reversed(statuses))  # sent at the next poll
                    raise
        except Exception as exc:
            forget(uri)  # the next poll checks the server again (short, then backs off)
            log.debug("neuron-mlflow: capture poll of run %s failed: %s", run_id, exc)


def start_for_stage(
    windows: Any, *, rank: int, world_size: int, run_id: str | None, tracking_uri: str | None
) -> OnDemand | None:
    """The watcher of an :class:`~neuron_mlflow.engine.attach.Attachment`'s first profiled
    stage (:class:`~neuron_mlflow.engine.stages.StageWindows`), started; ``None`` when nothing
    is asked for."""
    return OnDemand(
        windows.config,
        windows.prefix,
        rank=rank,
        world_size=world_size,
        request=windows.request_window,
        busy=lambda: windows.session is not None and windows.session.window_open,
        current_step=lambda: windows.next_step,
        run=lambda: run_id,
        tracking_uri=tracking_uri,
    ).start()
