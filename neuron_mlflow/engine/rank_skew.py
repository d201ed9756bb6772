"""The skew across ranks of one window: rank 0's worker reads every rank's
``P/rank/<r>/device_time_us`` (or ``cpu_time_us``) from the run and logs
``P/rank/max_over_median_time`` (1.0: balanced); no rank waits for another.

Example:
    >>> skew_of([100.0, 110.0, 150.0])
    1.3636363636363635
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from neuron_mlflow.naming import metric_key
from neuron_mlflow.sinks.window_record import Window

SKEW_METRIC = "max_over_median_time"


def skew_of(times: list[float]) -> float | None:
    """Max over median of the ranks' times (``None`` for fewer than two ranks)."""
    if len(times) < 2:
        return None
    median = statistics.median(times)
    return max(times) / median if median > 0 else None


@dataclass(frozen=True)
class SkewFollowUp:
    """Rank 0's uploaded window (its record), whose skew its worker logs once the capturing
    ``ranks``' times are in the run (at ``deadline``, a ``time.monotonic()`` time, from those
    that are)."""

    window: Window
    ranks: list[int]
    deadline: float


def rank_skew(request: SkewFollowUp, final: bool) -> bool:
    """Log the skew of one window once every capturing rank's time is in the run (or, when
    ``final``, from the ranks that are); True when logged or it never can be."""
    from mlflow import MlflowClient

    window = request.window
    prefix, run_id, step = str(window.prefix), str(window.run_id), window.metric_step
    client = MlflowClient(tracking_uri=window.tracking_uri)
    times: list[float] = []
    for rank in request.ranks:
        for name in ("device_time_us", "cpu_time_us"):
            key = metric_key(prefix, "rank", str(rank), name)
            values = [m.value for m in client.get_metric_history(run_id, key) if m.step == step]
            if values:
                times.append(values[-1])
                break
    if len(times) < len(request.ranks) and not final:
        return False
    skew = skew_of(times)
    if skew is not None:
        client.log_metric(run_id, metric_key(prefix, "rank", SKEW_METRIC), skew, step=step)
    return True
