"""Slow steps take a window by themselves: the detector behind ``ProfilerConfig.trigger``.

:class:`SlowStepDetector` runs on the training thread, one :meth:`~SlowStepDetector.add` per
step (no sort: the baseline median is recomputed every :data:`RECOMPUTE_EVERY` steps). The
recent median is above ``factor`` x the baseline exactly when more than half of the recent
steps are, so only a count of slow steps is kept.

Example:
    >>> from neuron_mlflow.config import SlowSteps
    >>> d = SlowStepDetector(SlowSteps(baseline_steps=10, min_steps=3, cooldown_steps=100))
    >>> [d.add(step, 0.01) for step in range(10)][-1] is None
    True
    >>> [d.add(step, 0.04) for step in range(10, 13)]
    [None, 4.0, None]
    >>> d.windows
    1
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from neuron_mlflow.config import SlowSteps

RECOMPUTE_EVERY = 16
"""Steps between two computations of the baseline median (it moves slowly)."""


class SlowStepDetector:
    """Say when the recent steps are slow against the running baseline (see module doc)."""

    def __init__(self, settings: SlowSteps) -> None:
        self.settings = settings
        self._baseline: deque[float] = deque(maxlen=settings.baseline_steps)
        self._recent: deque[float] = deque(maxlen=settings.min_steps)
        self._recent_slow: deque[bool] = deque(maxlen=settings.min_steps)
        self._slow_count = 0
        self._threshold = math.inf
        self._base_median = math.inf
        self._until_recompute = 0
        self._last_start = -math.inf
        self.windows = 0
        """Windows triggered so far."""

    def add(self, step: int, seconds: float) -> float | None:
        """Step ``step`` took ``seconds``. Returns the ratio (recent median over baseline
        median) when the next step should start a window, else ``None``."""
        settings = self.settings
        slow = seconds > self._threshold
        recent_slow = self._recent_slow
        if len(recent_slow) == settings.min_steps and recent_slow[0]:
            self._slow_count -= 1
        recent_slow.append(slow)
        self._recent.append(seconds)
        self._slow_count += slow
        baseline = self._baseline
        baseline.append(seconds)
        self._until_recompute -= 1
        if self._until_recompute <= 0 and len(baseline) == settings.baseline_steps:
            self._until_recompute = RECOMPUTE_EVERY
            self._base_median = median(baseline)
            self._threshold = settings.factor * self._base_median
        if self._slow_count * 2 <= len(recent_slow) or len(recent_slow) < settings.min_steps:
            return None
        if self.windows >= settings.max_windows:
            return None
        if step + 1 - self._last_start < settings.cooldown_steps:
            return None
        ratio = median(self._recent) / self._base_median
        self.windows += 1
        self._last_start = step + 1
        recent_slow.clear()
        self._recent.clear()
        self._slow_count = 0
        return ratio

    def refused(self) -> None:
        """The window could not be taken (e.g. it overlaps a scheduled one): not counted."""
        self.windows -= 1
        self._last_start = -math.inf
