"""Step scheduling as pure functions: which action a step takes and which window it is in.

The same semantics as ``torch.profiler.schedule`` (``skip_first``, ``wait``, ``warmup``,
``active``, ``repeat``; ``repeat=0`` means no limit), computed here so that steps outside a
window never touch the profiler at all.

Example:
    >>> from neuron_mlflow.config import Schedule
    >>> s = Schedule(wait=1, warmup=1, active=2, repeat=2)
    >>> [action_at(s, i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
    >>> window_at(s, 6)
    Window(index=1, start=5, first=6, last=7)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from neuron_mlflow.config import Schedule


class Action(enum.Enum):
    """What the profiler does during a step; mirrors ``torch.profiler.ProfilerAction``."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


@dataclass(frozen=True, slots=True)
class Window:
    """One profiling window: warm-up from ``start``, recorded steps ``first`` to ``last``.

    Step numbers count from 0, as the calls of a decorated function or the ``step()`` calls
    of a context manager do.

    Example:
        >>> Window(index=0, start=3, first=4, last=6).active_steps
        3
    """

    index: int
    start: int
    first: int
    last: int

    @property
    def active_steps(self) -> int:
        """Number of recorded steps: ``last - first + 1``."""
        return self.last - self.first + 1

    def __contains__(self, step: int) -> bool:
        return self.start <= step <= self.last


def window_at(schedule: Schedule, step: int) -> Window | None:
    """The window whose warm-up or recording includes ``step``, or ``None``.

    Example:
        >>> window_at(Schedule(warmup=1, active=3), 0)
        Window(index=0, start=0, first=1, last=3)
        >>> window_at(Schedule(warmup=1, active=3), 4) is None
        True
    """
    if step < schedule.skip_first:
        return None
    index, offset = divmod(step - schedule.skip_first, schedule.cycle_steps)
    if schedule.repeat and index >= schedule.repeat:
        return None
    if offset < schedule.wait:
        return None
    start = schedule.skip_first + index * schedule.cycle_steps + schedule.wait
    first = start + schedule.warmup
    return Window(index=index, start=start, first=first, last=first + schedule.active - 1)


def action_at(schedule: Schedule, step: int) -> Action:
    """The action of ``step``: ``NONE``, ``WARMUP``, ``RECORD`` or ``RECORD_AND_SAVE``.

    Example:
        >>> action_at(Schedule(warmup=0, active=1), 0).name
        'RECORD_AND_SAVE'
    """
    window = window_at(schedule, step)
    return Action.NONE if window is None else window_action(window, step)


def window_action(window: Window, step: int) -> Action:
    """The action of ``step`` in ``window`` alone (a scheduled or a requested window).

    Example:
        >>> [window_action(Window(9, 5, 6, 7), s).name for s in (4, 5, 6, 7)]
        ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE']
    """
    if step not in window:
        return Action.NONE
    if step < window.first:
        return Action.WARMUP
    return Action.RECORD_AND_SAVE if step == window.last else Action.RECORD


def next_window_start(schedule: Schedule, step: int) -> int | None:
    """The first step (start of warm-up) of the earliest window starting at or after ``step``.

    Returns ``None`` when no such window exists.

    Example:
        >>> s = Schedule(wait=2, warmup=1, active=2, repeat=2)
        >>> next_window_start(s, 0), next_window_start(s, 3), next_window_start(s, 8)
        (2, 7, None)
    """
    first_start = schedule.skip_first + schedule.wait
    index = 0 if step <= first_start else -(-(step - first_start) // schedule.cycle_steps)
    if schedule.repeat and index >= schedule.repeat:
        return None
    return first_start + index * schedule.cycle_steps


def next_window_start_skipping(schedule: Schedule, skip: set[int], step: int) -> int | None:
    """Like :func:`next_window_start`, passing over windows whose index is in ``skip``.

    Example:
        >>> s = Schedule(warmup=0, active=2, repeat=3)
        >>> next_window_start_skipping(s, {0}, 0)
        2
    """
    start = next_window_start(schedule, step)
    while start is not None:
        window = window_at(schedule, start)
        if window is None or window.index not in skip:
            return start
        start = next_window_start(schedule, window.last + 1)
    return None
