"""The worker process: puts queued windows in place, summarises and uploads them.

Everything slow after a window's end runs here, idle-class, without torch or user code,
with ``sync``'s pipeline; one worker per spool (docs/spool.md, "The worker process").

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> Worker(root).run_once()  # an empty queue: nothing to do
    0
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from neuron_mlflow.engine.legacy_queue import legacy_job
from neuron_mlflow.engine.rank_skew import SkewFollowUp, rank_skew
from neuron_mlflow.sinks.claims import (
    QUEUE,
    WORKER_LOCK,
    Claim,
    claim,
    claim_file,
    queued_jobs,
    release,
    remove_if_free,
    worker_running,
)
from neuron_mlflow.sinks.spool import Spool
from neuron_mlflow.sinks.window_record import Window, decode_window, encode_window

if TYPE_CHECKING:
    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

CLIENTS = ".clients"
"""One lock file per living training process that handed windows to the worker."""
CAPTURING = ".capturing"
"""One lock file per window being captured: the worker starts no job while one is held."""
PAUSE_MAX_S = float(os.environ.get("NEURON_MLFLOW_WORKER_PAUSE_MAX_S", "30"))
"""The longest the worker waits for a window being captured before it starts a job anyway."""
WORKER_LOG = "worker.log"
"""The worker's log (its stdout and stderr too)."""
IDLE_S = float(os.environ.get("NEURON_MLFLOW_WORKER_IDLE_S", "60"))
"""How long a worker with living clients waits for work before it exits."""
_STARTED: dict[Path, subprocess.Popen[bytes]] = {}
"""The worker this process started last, per spool: no second one while it lives (an
idle-class interpreter can take minutes to start)."""

MAX_ATTEMPTS = 3
"""A job whose worker died this often (a trace that kills it) is given up: marked failed."""
SKEW_WAIT_S = 30.0
"""How long rank 0's worker waits for the other ranks' times before it logs the skew."""

log = logging.getLogger("neuron_mlflow.worker")

_job_counter = itertools.count()


def read_job(root: Path, path: Path) -> Window:
    """The window record queued in the job file ``path`` (a schema 2 job is read by
    :mod:`neuron_mlflow.engine.legacy_queue`).

    Raises:
        OSError: the file is gone, or the window it names is neither staged nor in place.
        ValueError: the file is not a record.
    """
    raw = path.read_bytes()
    if b'"schema_version"' not in raw[:64]:
        return legacy_job(root, raw, str(path))
    return decode_window(raw, str(path))


def read_jobs(root: Path) -> list[tuple[Path, Window | Exception]]:
    """The queue's jobs, oldest first: each one's record, or why it cannot be read."""
    found: list[tuple[Path, Window | Exception]] = []
    for path in queued_jobs(root):
        try:
            found.append((path, read_job(root, path)))
        except (OSError, ValueError) as exc:
            found.append((path, exc))
    return found


def queued_place(root: Path, window: Window) -> Path:
    """Where a queued window is, or will be, in place."""
    return root / window.session / window.artifact_path


def drop_job(path: Path) -> None:
    """Remove the queued job at ``path`` (gone already is fine)."""
    with contextlib.suppress(OSError):
        path.unlink()


def held_locks(folder: Path) -> bool:
    """True while a process holds one of the lock files in ``folder`` (``.clients/``,
    ``.capturing/``); the free ones are removed (their process is gone or between windows)."""
    held = False
    for path in folder.glob("*.lock") if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            if not remove_if_free(path):
                held = True
    return held


class WorkerClient:
    """The training process's side: register, queue a window, start the worker if none runs.

    Args:
        root: the spool root (``local_dir``).

    Example:
        >>> import tempfile
        >>> client = WorkerClient(Path(tempfile.mkdtemp()))
        >>> client.queued()
        []
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._client_fd: Claim | None = None

    def _register(self) -> None:
        if self._client_fd is not None:
            return
        folder = self.root / CLIENTS
        folder.mkdir(parents=True, exist_ok=True)
        self._client_fd = claim_file(folder / f"{os.getpid()}_{id(self)}.lock")

    def submit(self, window: Window) -> Path:
        """Queue the window's record (written under a hidden name, renamed into the queue),
        then :meth:`ensure_running`: the worker started when the window opened may have
        left meanwhile (its own probe held the capturing lock when the window claimed it).

        Returns:
            The job file.
        """
        self._register()
        queue = self.root / QUEUE
        name = f"{time.time_ns():020d}_{os.getpid()}_{next(_job_counter)}.json"
        tmp = queue / f".{name}.tmp"
        data = encode_window(window)
        try:
            tmp.write_bytes(data)
        except FileNotFoundError:  # no queue folder yet (or removed since)
            queue.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
        os.replace(tmp, queue / name)
        self.ensure_running()  # after the job is in the queue: a leaving worker sees it
        return queue / name

    def ensure_running(self) -> bool:
        """Start the worker unless one holds the spool's worker lock; True when started."""
        self._register()
        if worker_running(self.root):
            return False  # it sees the job: it re-reads the queue before exit
        if _own_worker(self.root) is not None:
            return False  # this process's is starting (or leaving: it found another's lock)
        _STARTED[self.root] = start_worker(self.root)
        return True

    def capturing(self) -> Claim | None:
        """Hold this while a window is captured (the worker starts no job meanwhile, at most
        :data:`PAUSE_MAX_S`); give the claim to :meth:`captured` when the window ends."""
        (self.root / CAPTURING).mkdir(parents=True, exist_ok=True)
        return claim_file(self._capturing_file())

    def captured(self, held: Claim) -> None:
        """The window is no longer captured: its lock file is removed, then the claim
        released, so ``.capturing/`` holds only the windows being captured."""
        with contextlib.suppress(OSError):  # removed under the claim: nobody else holds it
            self._capturing_file().unlink()
        held.release()

    def _capturing_file(self) -> Path:
        return self.root / CAPTURING / f"{os.getpid()}_{id(self)}.lock"

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """While the caller waits for it, the worker this process started runs in the
        normal scheduling class (on a busy host an idle-class worker gets almost no CPU).
        Needs ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` of 20; elsewhere it stays idle-class."""
        worker = _own_worker(self.root)
        if worker is None or not _set_policy(worker.pid, idle=False):
            yield
            return
        try:
            yield
        finally:
            _set_policy(worker.pid, idle=True)

    def queued(self) -> list[Path]:
        """The job files still queued."""
        return queued_jobs(self.root)

    def close(self) -> None:
        """Unregister (the worker then finishes the queue and exits)."""
        held, self._client_fd = self._client_fd, None
        release(held)


def _own_worker(root: Path) -> subprocess.Popen[bytes] | None:
    """The worker this process started for the spool ``root``, while it lives."""
    started = _STARTED.get(root)
    return started if started is not None and started.poll() is None else None


def start_worker(root: Path) -> subprocess.Popen[bytes]:
    """Start the worker of ``root``, idle-class, logging to ``worker.log``; it outlives this
    process. Its own process group, not session (autogroup: docs/benchmarks.md)."""
    root.mkdir(parents=True, exist_ok=True)
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    with open(root / WORKER_LOG, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "neuron_mlflow.engine.worker", str(root)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            process_group=0,  # a Ctrl-C to the job's group does not stop the upload
            close_fds=True,
            env=env,
        )
    run_idle(popen.pid)  # at once: its interpreter start and imports are idle-priority too
    return popen


def run_idle(pid: int) -> None:
    """Put process ``pid`` in the idle scheduling class (``SCHED_IDLE``, Linux; else
    ``nice`` 19): on a CPU that the training thread wants, the worker waits."""
    if not _set_policy(pid, idle=True):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, 19)


def _set_policy(pid: int, idle: bool) -> bool:
    """Every thread of ``pid`` in the idle or normal class; False where refused or not Linux."""
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    try:
        for thread in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setscheduler(thread, policy, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


@dataclass
class Worker:
    """The worker loop over one spool.

    Args:
        root: the spool root.
        idle_s: how long to wait for work while clients live.
    """

    root: Path
    idle_s: float = IDLE_S
    _sinks: dict[str | None, MlflowSink] = field(default_factory=dict)
    _followups: list[SkewFollowUp] = field(default_factory=list)
    _orphaned_since: float | None = None
    _followups_at: float = 0.0

    def capture_in_progress(self) -> bool:
        """True while a training process captures a window (free lock files are removed)."""
        return held_locks(self.root / CAPTURING)

    def wait_for_captures(self) -> None:
        """Start no job while a window is being captured (at most :data:`PAUSE_MAX_S`)."""
        deadline = time.monotonic() + PAUSE_MAX_S
        while self.capture_in_progress() and time.monotonic() < deadline:
            time.sleep(0.02)

    def sink(self, tracking_uri: str | None) -> MlflowSink:
        """One sink per tracking server: it keeps the runs it chose."""
        if tracking_uri not in self._sinks:
            from neuron_mlflow.sinks.mlflow_sink import MlflowSink

            self._sinks[tracking_uri] = MlflowSink(tracking_uri)
        return self._sinks[tracking_uri]

    def run_once(self) -> int:
        """Process every job queued now; returns how many."""
        spool, jobs = Spool(self.root), []
        for path, job in read_jobs(self.root):
            if isinstance(job, Window):
                jobs.append((path, job))
            elif not (isinstance(job, FileNotFoundError) and not path.exists()):  # not taken
                log.warning("neuron-mlflow worker: unreadable job %s (%s); dropped", path, job)
                drop_job(path)
        for _, window in jobs:  # all in place first: in place even if the time runs out
            if spool.staged_dir(window).is_dir():
                self.wait_for_captures()
                try:
                    spool.place(window)
                except OSError as exc:  # tried again by process_job, which reports it
                    where = queued_place(self.root, window)
                    log.warning("neuron-mlflow worker: could not put %s in place (%s)", where, exc)
        done = 0
        for path, window in jobs:
            timeout_s = window.config.upload_timeout_s if window.config is not None else 60.0
            if self._orphaned_since is not None and (
                time.monotonic() - self._orphaned_since > timeout_s
            ):
                return done  # out of time: it stays in the spool for `sync`
            self.wait_for_captures()
            if window.attempts >= MAX_ATTEMPTS:
                give_up(self, window)
            else:  # counted first: a job that kills the worker is not retried forever
                again = msgspec.structs.replace(window, attempts=window.attempts + 1)
                path.write_bytes(encode_window(again))
                if not process_job(self, window):
                    break  # `sync` holds the window: the job stays, tried again later
            drop_job(path)
            done += 1
        self._run_followups()
        return done

    def _run_followups(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._followups_at < 2.0:
            return  # each look is a few MLflow requests: every 2 s is enough
        self._followups_at = now
        left = []
        for pending in self._followups:  # kept while not logged (never once final or late)
            try:
                if not rank_skew(pending, final=final or now > pending.deadline):
                    left.append(pending)
            except Exception as exc:
                log.warning("neuron-mlflow worker: the rank skew could not be logged (%s)", exc)
        self._followups = left

    def loop(self, lock: Claim | None = None) -> None:
        """Serve the queue until idle with no clients (or out of time), then exit.

        Args:
            lock: the spool's worker lock, already taken (``main`` takes it first).
        """
        lock = lock or claim_file(self.root / WORKER_LOCK)
        if lock is None:
            return  # another worker serves this spool
        last_work = time.monotonic()
        try:
            while True:
                alive = held_locks(self.root / CLIENTS)  # a training process lives
                now = time.monotonic()
                if alive:
                    self._orphaned_since = None
                elif self._orphaned_since is None:
                    self._orphaned_since = now
                if self.run_once():
                    last_work = time.monotonic()
                    continue
                if not alive and (left := queued_jobs(self.root)):  # the rest is for `sync`
                    self._run_followups(final=True)
                    log.warning(
                        "neuron-mlflow worker: out of time (upload_timeout_s) after the "
                        "training process ended; %d window(s) stay in %s for "
                        "`neuron-mlflow sync --local-dir %s`",
                        len(left), self.root, self.root,
                    )  # fmt: skip
                    return
                if self._followups:
                    time.sleep(0.1)
                    continue
                capturing = alive and self.capture_in_progress()  # a job is coming
                if now - last_work > (self.idle_s if alive else 0.0) and not capturing:
                    release(lock)
                    lock = None
                    # a job queued, or a window opened, while we decided to stop: its
                    # client saw our lock held
                    if not queued_jobs(self.root) and not (alive and self.capture_in_progress()):
                        return
                    lock = claim_file(self.root / WORKER_LOCK)
                    if lock is None:
                        return  # the client started another worker: it takes the job
                    continue
                time.sleep(0.02 if now - last_work < 1.0 else 0.1)  # slower once idle
        finally:
            release(lock)


def give_up(worker: Worker, window: Window) -> None:
    """The window killed the worker :data:`MAX_ATTEMPTS` times: it is marked failed."""
    with contextlib.suppress(Exception):
        record = Spool(worker.root).place(window)
        record.failed(f"the worker process died {window.attempts} times on this window")
        record.handled()
    log.warning("neuron-mlflow worker: gave up on %s after %d attempts",
                queued_place(worker.root, window), window.attempts)  # fmt: skip


def process_job(worker: Worker, window: Window) -> bool:
    """Put one queued window in place and finish it, the outcome in its record; never raises.
    False when a ``sync`` holds the window (the job waits)."""
    from neuron_mlflow.engine.pipeline import WindowFailed, finish_window

    path = queued_place(worker.root, window)
    try:
        record = Spool(worker.root).place(window)
    except (OSError, ValueError) as exc:
        log.warning("neuron-mlflow worker: window %s is gone or unreadable (%s)", path, exc)
        return True
    try:
        record.claim = claim(record.path)
    except OSError as exc:
        log.warning("neuron-mlflow worker: window %s cannot be claimed (%s)", path, exc)
        return True
    if record.claim is None:
        return False  # a `neuron-mlflow sync` holds it: the job waits for it
    try:
        record.reload()
        upload = window.upload and record.status == "pending"
        sink = worker.sink(record.window.tracking_uri) if upload else None
        try:
            finish_window(record, sink)
        except WindowFailed as exc:
            log.warning("neuron-mlflow: %s; kept at %s", exc, record.path)
        else:
            if sink is not None and window.skew_ranks and record.window.run_id:
                deadline = time.monotonic() + SKEW_WAIT_S
                worker._followups.append(SkewFollowUp(record.window, window.skew_ranks, deadline))
        record.handled()
    except Exception as exc:  # never let one window stop the worker
        log.exception("neuron-mlflow worker: window %s failed", path)
        with contextlib.suppress(Exception):
            record.update(error=f"{type(exc).__name__}: {exc}")
            record.handled()
    finally:
        record.release()
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m neuron_mlflow.engine.worker <local_dir>``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m neuron_mlflow.engine.worker <local_dir>", file=sys.stderr)
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # its terminal closing does not stop it
    # MLflow's import forks `uname -p` (platform.platform()): fork now, while this process
    # is small, not inside the training thread's next window
    platform.processor()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(message)s"
    )
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    root = Path(args[0]).absolute()
    lock = claim_file(root / WORKER_LOCK)  # first: a worker that imports is already serving
    if lock is None:
        return 0  # another worker serves this spool
    worker = Worker(root)
    if os.environ.get("NEURON_MLFLOW_WORKER_PRELOAD", "1") != "0":
        worker.wait_for_captures()  # the imports are not measured by a window
        import mlflow  # noqa: F401

        import neuron_mlflow.engine.pipeline
        import neuron_mlflow.sinks.mlflow_sink  # noqa: F401
    worker.loop(lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
