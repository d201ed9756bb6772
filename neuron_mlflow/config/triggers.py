"""Windows the job takes by itself: :class:`SlowSteps` (``ProfilerConfig.trigger``).

The detection runs on the training thread (:mod:`neuron_mlflow.engine.slow_steps`); this
module only holds the settings.

Example:
    >>> SlowSteps().factor, SlowSteps().min_steps
    (1.5, 5)
    >>> try:
    ...     SlowSteps(min_steps=300)
    ... except ValueError as err:
    ...     print(str(err).splitlines()[1][:60])
      (root): got {'min_steps': 300}; Value error, min_steps=300
"""

from __future__ import annotations

from pydantic import Field, model_validator

from neuron_mlflow.config.validation import _StrictModel


class SlowSteps(_StrictModel):
    """Take a window when steps slow down (the rule: docs/on-demand.md)."""

    factor: float = Field(1.5, gt=1.0, le=1000, description="slow = median above factor x baseline")
    baseline_steps: int = Field(
        200, ge=2, le=100_000, description="steps of the running baseline median (steps)"
    )
    min_steps: int = Field(5, ge=1, description="recent steps whose median is compared (steps)")
    max_windows: int = Field(3, ge=0, description="triggered windows per job at most (count)")
    cooldown_steps: int = Field(
        1000, ge=0, description="steps between the starts of two triggered windows (steps)"
    )

    @model_validator(mode="after")
    def _recent_below_baseline(self) -> SlowSteps:
        if self.min_steps >= self.baseline_steps:
            raise ValueError(
                f"min_steps={self.min_steps} must be below baseline_steps="
                f"{self.baseline_steps} (the recent steps are compared with a longer baseline)"
            )
        return self
