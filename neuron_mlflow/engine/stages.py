"""Window bookkeeping for a front end that drives a session step by step, stage by stage.

:class:`StageWindows` keeps one stage's open step, its done windows (saved in checkpoints),
the first step that can touch a window (hooks before it return at once) and the plan check.

Example:
    >>> import tempfile
    >>> import neuron_mlflow as nm
    >>> from neuron_mlflow.engine.session import ProfilingSession
    >>> config = nm.ProfilerConfig(backend="cpu", local_dir=tempfile.mkdtemp(),
    ...                            schedule=nm.Schedule(warmup=1, active=1))
    >>> windows = StageWindows(config, "profile/train",
    ...                        lambda: ProfilingSession(config, prefix="profile/train"))
    >>> for step in range(3):
    ...     windows.begin(step)
    ...     windows.end(step + 1)
    >>> windows.done, windows.summary.steps
    ({0}, 1)
    >>> windows.close()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.errors import ConfigError, WindowRequestRefused
from neuron_mlflow.schedule import Window, next_window_start, window_at

if TYPE_CHECKING:
    from neuron_mlflow.engine.capture_requests import OnDemand
    from neuron_mlflow.engine.session import ProfilingSession
    from neuron_mlflow.summary.ops import OpSummary


def check_stages(
    stages: str | Iterable[str], allowed: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    """The stages to profile, checked against ``allowed`` (a front end's stages), in order,
    without repeats.

    Example:
        >>> check_stages("validate", ("train", "validate"))
        ('validate',)
    """
    chosen = (stages,) if isinstance(stages, str) else tuple(stages)
    bad = [s for s in chosen if allowed is not None and s not in allowed]
    if bad or not chosen:
        raise ConfigError(
            f"invalid stages {chosen!r}: {'unknown ' + repr(bad) if bad else 'none given'}; "
            f"allowed: {', '.join(allowed or ())}"
        )
    return tuple(dict.fromkeys(chosen))


def check_ranks(ranks: Iterable[int] | None) -> frozenset[int] | None:
    """The global ranks that capture, checked (``None``: all ranks).

    Example:
        >>> sorted(check_ranks([1, 0]))
        [0, 1]
    """
    if ranks is None:
        return None
    chosen = tuple(ranks)
    bad = [r for r in chosen if not isinstance(r, int) or isinstance(r, bool) or r < 0]
    if bad or not chosen:
        raise ConfigError(
            f"invalid ranks {chosen!r}: expected global ranks as integers >= 0 "
            "(or None for all ranks)"
        )
    return frozenset(chosen)


class StageWindows:
    """The window life cycle of one stage: open step, done windows, quiet steps.

    Args:
        config: the stage's configuration (its schedule decides the windows).
        prefix: the stage's metric prefix (``profile/train``).
        open_session: makes the stage's session on the first step that touches a window;
            returns ``None`` on a rank that does not capture (it still marks windows done).

    See the module docstring for an example.
    """

    def __init__(
        self,
        config: ProfilerConfig,
        prefix: str,
        open_session: Callable[[], ProfilingSession | None],
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.done: set[int] = set()
        """Indices of scheduled windows ended (logged, or given up) in this stage, on every
        rank; saved in checkpoints, and the sessions' ``skip_windows`` (the same set)."""
        self.session: ProfilingSession | None = None
        self._last_session: ProfilingSession | None = None
        self._closed: list[ProfilingSession] = []  # closed sessions not waited for yet
        self.open_step: int | None = None
        self.next_step = 0
        """The number of the stage's next step (kept by the front end)."""
        self.metric_step = 0  # the MLflow step of the window being logged
        self.plan_checked = False
        self._open_session = open_session
        self.quiet_until = self._first_start(0)
        """Steps before this one cannot touch a window: they return at once (a comparison)."""
        self.watch: OnDemand | None = None
        """Capture requests and the slow-step trigger of this stage (set by the front end)."""

    def request_window(
        self, steps: int, warmup: int = 0, start: int | None = None, reason: str = "request"
    ) -> Window:
        """Capture a window outside the schedule from step ``start`` (default: the next
        step); see :meth:`~neuron_mlflow.engine.session.ProfilingSession.request_window`.

        Raises:
            WindowRequestRefused: this rank does not capture, or the session refused it.
        """
        if self.session is None:
            self.session = self._open_session()
        if self.session is None:
            raise WindowRequestRefused("this rank does not capture (ranks, stages or off)")
        if start is None:
            start = self.next_step if self.open_step is None else self.open_step + 1
        # the session counts only the steps that reach it (quiet ones do not): it learns the
        # stage's step first, or it would judge ``start`` against the end of its last window
        self.session.seek(self.next_step if self.open_step is None else self.open_step)
        window = self.session.request_window(steps, warmup, start, reason)
        self.quiet_until = min(self.quiet_until, window.start)
        return window

    def _first_start(self, step: int) -> float:
        """The first step from ``step`` that can touch a window: the schedule's next start (a
        done window's too: its end marks it done on every rank), or the session's if sooner."""
        first = next_window_start(self.config.schedule, step)
        session = self.session
        own = None if session is None else session.next_window_step
        return min((s for s in (first, own) if s is not None), default=math.inf)

    def restart(self, step: int = 0, quiet: bool = True) -> None:
        """A new run of the stage starts at ``step`` (``quiet``: recompute the quiet steps)."""
        self.next_step = step
        self.open_step = None
        if quiet:
            self.quiet_until = self._first_start(0)

    def begin_quiet(self, step: int) -> bool:
        """Step ``step`` begins, if it cannot touch a window: then it is only noted (a
        comparison) and True is returned; else nothing happens (call :meth:`begin`). Never
        raises: a front end calls it outside its guard."""
        if step < self.quiet_until:
            watch = self.watch
            if watch is None or not watch.hot:
                self.open_step = step
                return True
        return False

    def end_quiet(self) -> bool:
        """The open step ends, if it could not touch a window: True (nothing else happens);
        else nothing happens (call :meth:`end`). Never raises."""
        step = self.open_step
        if step is not None and step < self.quiet_until:
            self.open_step = None
            return True
        return False

    def begin(self, step: int, call_name: str | None = None) -> None:
        """Step ``step`` begins (fast when it cannot touch a window).

        ``call_name`` marks the step's own work (``neuron_mlflow: <call_name>``, until
        :meth:`end`), so that a window counts only what runs inside its steps.
        """
        self.open_step = step
        watch = self.watch
        if watch is not None and watch.hot:  # a capture request or the slow-step trigger
            watch.tick(step)  # (a request it takes lowers quiet_until)
        if step < self.quiet_until:
            return
        if self.session is None:
            self.session = self._open_session()
        if self.session is not None:
            self.session.seek(step)
            self.session.begin_step(call_name)

    def end(self, metric_step: int) -> None:
        """The open step ends; a window it completes is handed to the worker."""
        step = self.open_step
        if step is None:
            return
        self.open_step = None
        if step < self.quiet_until:
            return
        self.metric_step = metric_step
        if self.session is not None:
            self.session.end_step()
        window = window_at(self.config.schedule, step)
        if window is None or step == window.last:
            self.quiet_until = self._first_start(step + 1)
            if window is not None:  # its last step: nothing waits, no rank meets another
                self.done.add(window.index)

    def finish(self, last_step: int | None = None) -> None:
        """The stage ends after ``last_step`` (default: the open step, else the one before
        :attr:`next_step`): a window cut short is logged (partial)."""
        if last_step is None:
            last_step = self.open_step if self.open_step is not None else self.next_step - 1
        self.open_step = None
        if last_step < 0:
            return
        window = window_at(self.config.schedule, last_step)
        if window is None or last_step < window.first or window.index in self.done:
            return
        if self.session is not None:
            self.session.flush()
        self.done.add(window.index)

    @property
    def summary(self) -> OpSummary | None:
        """The summary of the last window this rank captured (waits, bounded, for the worker
        process to summarise it: only when asked)."""
        session = self.session or self._last_session
        return session.summary if session is not None else None

    def plan_warning(
        self, stage: str, planned: float | None, start: int, detail: str
    ) -> str | None:
        """Once per stage: why the schedule cannot complete a window in ``planned`` steps
        (counted from ``start``), or ``None`` when it can (or the plan is unknown).

        Example:
            >>> import neuron_mlflow as nm
            >>> config = nm.ProfilerConfig(schedule=nm.Schedule(wait=1, warmup=1, active=5))
            >>> w = StageWindows(config, "profile/train", lambda: None)
            >>> w.plan_warning("train", 4, 0, "max_steps=4")[:80]
            "the 'train' schedule (skip_first=0, wait=1, warmup=1, active=5, repeat=1) needs "
            >>> w.plan_warning("train", 4, 0, "max_steps=4") is None  # once
            True
        """
        if self.plan_checked:
            return None
        self.plan_checked = True
        if planned is None or math.isinf(planned):
            return None
        schedule = self.config.schedule
        first = next_window_start(schedule, start)
        window = window_at(schedule, first) if first is not None else None
        if window is not None and window.last < planned:
            return None
        needed = "no window left" if window is None else f"steps up to {window.last}"
        return (
            f"the {stage!r} schedule (skip_first="
            f"{schedule.skip_first}, wait={schedule.wait}, warmup={schedule.warmup}, "
            f"active={schedule.active}, repeat={schedule.repeat}) needs {needed} to "
            f"complete a window, but the stage plans {int(planned)} steps ({detail}); "
            "a window cut short is logged as partial, one that never starts is not logged"
        )

    def abort(self, exc: BaseException) -> None:
        """The job failed: an open window keeps its capture (incomplete); no step is open."""
        if self.session is not None and self.session.window_open:
            self.session.abort(exc)  # never raises
        self.open_step = None

    def close(self) -> None:
        """Close the session (a later step opens a new one): a window still open is logged
        as partial and handed to the worker process; nothing waits for it (:meth:`wait`)."""
        session, self.session = self.session, None
        if session is not None:
            self._last_session = session
            self._closed.append(session)
            session.close()

    def wait(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the worker process has finished every window
        this stage handed it, in its open and closed sessions; True when none is left."""
        deadline = time.monotonic() + timeout_s
        left = []
        for session in [*self._closed, *([self.session] if self.session else [])]:
            if not session.wait(max(0.0, deadline - time.monotonic())):
                left.append(session)
        self._closed = [s for s in self._closed if s in left]
        return not left
