"""The skew across ranks of one window, computed by rank 0's worker from the ranks' metrics.

Every rank's worker logs its own ``P/rank/<r>/device_time_us`` (or ``cpu_time_us``) and
``P/rank/<r>/wall_time_us`` into the job's run. Rank 0's worker then reads back the device
times (else the CPU times; not the wall times) and logs ``P/rank/max_over_median_time``:
the slowest rank's time over the median rank's, at the window's metric step (1.0: balanced;
1.5: one rank takes half as long again as the typical one). Nothing here runs on a training
thread, and no rank waits for another.

Example:
    >>> skew_of([100.0, 110.0, 150.0])
    1.3636363636363635
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from neuron_mlflow.naming import metric_key

SKEW_METRIC = "max_over_median_time"
"""``P/rank/max_over_median_time``."""


def skew_of(times: list[float]) -> float | None:
    """Max over median of the ranks' times (``None`` for fewer than two ranks)."""
    if len(times) < 2:
        return None
    median = statistics.median(times)
    return max(times) / median if median > 0 else None


@dataclass(frozen=True)
class SkewFollowUp:
    """Rank 0's window, uploaded: its worker logs the skew once the ranks' times are in
    the run (or at ``deadline``, a ``time.monotonic()`` time, from the ranks that are).

    Attributes:
        prefix: the metric prefix ``P``.
        metric_step: the window's metric step.
        ranks: the global ranks that capture.
        run_id, tracking_uri: the run the window went to.
        deadline: when the worker stops waiting for the other ranks.
    """

    prefix: str
    metric_step: int
    ranks: tuple[int, ...]
    run_id: str
    tracking_uri: str
    deadline: float


def rank_skew(request: SkewFollowUp, final: bool) -> bool:
    """Log the skew of one window once every capturing rank's time is in the run (or, when
    ``final``, from the ranks that are: a rank that stopped profiling holds nobody).

    Returns:
        True when the skew was logged or can never be (fewer than two ranks by ``final``).
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=request.tracking_uri)
    times: list[float] = []
    for rank in request.ranks:
        for name in ("device_time_us", "cpu_time_us"):
            key = metric_key(request.prefix, "rank", str(rank), name)
            values = [
                m.value for m in client.get_metric_history(request.run_id, key)
                if m.step == request.metric_step
            ]  # fmt: skip
            if values:
                times.append(values[-1])
                break
    if len(times) < len(request.ranks) and not final:
        return False
    skew = skew_of(times)
    if skew is not None:
        key = metric_key(request.prefix, "rank", SKEW_METRIC)
        client.log_metric(request.run_id, key, skew, step=request.metric_step)
    return True
