"""Window bookkeeping for a front end that drives a session step by step, stage by stage.

A front end (the Lightning callback) says when a step begins and ends; :class:`StageWindows`
keeps the rest for one stage: which step is open, which windows are done (saved in checkpoints),
the first step that can touch a window (hooks before it return at once), the plan check, and,
when a window ends, every rank's times gathered through :class:`RankGroup` and logged by the
root rank. Nothing here imports a training framework: ranks meet through a callable.

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
    ...     windows.end(step + 1, RankGroup())
    >>> windows.done, windows.summary.steps
    ({0}, 1)
    >>> windows.close()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.errors import ConfigError
from neuron_mlflow.naming import metric_key
from neuron_mlflow.schedule import Action, action_at, next_window_start, window_at

if TYPE_CHECKING:
    from neuron_mlflow.engine.session import ProfilingSession
    from neuron_mlflow.summary.ops import OpSummary

Gather = Callable[[list[float]], list[list[float]]]
"""Collective: every rank passes one row of floats, every rank gets all rows (in rank order)."""


def _alone(row: list[float]) -> list[list[float]]:
    return [row]


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


@dataclass
class RankGroup:
    """How the ranks of a job meet when a window ends (one process by default).

    Args:
        gather: the collective (see :data:`Gather`); every rank must call it for every window.
        is_root: this rank logs the per-rank metrics.
        tracking_uri: MLflow tracking URI of the run (``None``: the default).
        run_id: the run per-rank metrics go to (``None``: the session's own run, if any).

    Example:
        >>> RankGroup().gather([1.0, 2.0])
        [[1.0, 2.0]]
    """

    gather: Gather = field(default=_alone)
    is_root: bool = True
    tracking_uri: str | None = None
    run_id: str | None = None


class StageWindows:
    """The window life cycle of one stage: open step, done windows, quiet steps, rank times.

    Args:
        config: the stage's configuration (its schedule decides the windows).
        prefix: the stage's metric prefix (``profile/train``).
        open_session: makes the stage's session on the first step that touches a window;
            returns ``None`` on a rank that does not capture (it still gathers).

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
        """Indices of windows logged (or given up) by this stage; saved in checkpoints."""
        self.session: ProfilingSession | None = None
        self.summary: OpSummary | None = None
        """The summary of the last window this rank captured."""
        self.open_step: int | None = None
        self.next_step = 0
        """The number of the stage's next step (kept by the front end)."""
        self.metric_step = 0
        """The MLflow step of the window being logged."""
        self.plan_checked = False
        self._open_session = open_session
        self.quiet_until = self._first_start(0)

    def _first_start(self, step: int) -> float:
        first = next_window_start(self.config.schedule, step)
        return math.inf if first is None else first

    def restart(self, step: int = 0, quiet: bool = True) -> None:
        """A new run of the stage starts at ``step`` (``quiet``: recompute the quiet steps)."""
        self.next_step = step
        self.open_step = None
        if quiet:
            self.quiet_until = self._first_start(0)

    def begin(self, step: int, call_name: str | None = None) -> None:
        """Step ``step`` begins (fast when it cannot touch a window).

        ``call_name`` marks the step's own work (``neuron_mlflow: <call_name>``, until
        :meth:`end`), so that a window counts only what runs inside its steps.
        """
        self.open_step = step
        if step < self.quiet_until:
            return
        if self.session is None:
            self.session = self._open_session()
        if self.session is not None:
            self.session.seek(step)
            self.session.begin_step(call_name)

    def end(self, metric_step: int, group: RankGroup) -> None:
        """The open step ends; a window it completes is gathered and logged."""
        step = self.open_step
        if step is None:
            return
        self.open_step = None
        if step < self.quiet_until:
            return
        self.metric_step = metric_step
        if self.session is not None:
            self.session.end_step()
        schedule = self.config.schedule
        window = window_at(schedule, step)
        if window is None or step == window.last:
            self.quiet_until = self._first_start(step + 1)
        if window is not None and action_at(schedule, step) == Action.RECORD_AND_SAVE:
            self.window_ended(window.index, group)

    def finish(self, last_step: int | None, group: RankGroup) -> None:
        """The stage ends after ``last_step``: a window cut short is logged (partial)."""
        self.open_step = None
        if last_step is None or last_step < 0:
            return
        window = window_at(self.config.schedule, last_step)
        if window is None or last_step < window.first or window.index in self.done:
            return
        if self.session is not None:
            self.session.flush()
        self.window_ended(window.index, group)

    def window_ended(self, index: int, group: RankGroup) -> None:
        """Every rank: mark window ``index`` done, gather per-rank times, the root logs them."""
        if index in self.done:
            return
        session = self.session
        row = [math.nan, math.nan, math.nan]
        summary = session.summary if session is not None else None
        records = session.records if session is not None else []
        if summary is not None and records and records[-1].manifest["window"]["index"] == index:
            self.summary = summary
            device = summary.device_time_us
            row = [
                device if device is not None else summary.cpu_time_us,
                summary.wall_time_us,
                0.0 if device is None else 1.0,
            ]
        self.done.add(index)
        rows = group.gather(row)
        if group.is_root:
            self.log_rank_times(rows, group)

    def rank_metrics(self, rows: list[list[float]]) -> dict[str, float]:
        """Per-rank metrics from gathered rows ``(time_us, wall_us, has_device)``.

        Example:
            >>> import neuron_mlflow as nm
            >>> w = StageWindows(nm.ProfilerConfig(), "profile/train", lambda: None)
            >>> w.rank_metrics([[5.0, 7.0, 0.0], [float("nan")] * 3])
            {'profile/train/rank/0/cpu_time_us': 5.0, 'profile/train/rank/0/wall_time_us': 7.0}
        """
        metrics: dict[str, float] = {}
        for rank, (time_us, wall_us, has_device) in enumerate(rows):
            if math.isnan(time_us):
                continue
            name = "device_time_us" if has_device == 1.0 else "cpu_time_us"
            metrics[metric_key(self.prefix, "rank", str(rank), name)] = time_us
            metrics[metric_key(self.prefix, "rank", str(rank), "wall_time_us")] = wall_us
        return metrics

    def log_rank_times(self, rows: list[list[float]], group: RankGroup) -> None:
        """Hand :meth:`rank_metrics` to the spool and the background uploader (never logged
        from the training thread); they follow the window into its run."""
        session = self.session
        metrics = self.rank_metrics(rows)
        if session is None or not metrics:
            return
        records = session.records
        if not records:
            return
        session.guard(session.spool_metrics, records[-1], metrics, self.metric_step)

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
        """Close the session (a later step opens a new one)."""
        if self.session is not None:
            self.session.close()
        self.session = None
