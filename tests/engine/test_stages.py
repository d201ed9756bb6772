"""A stage's window bookkeeping (``StageWindows``): the quiet steps before the next window
come from the schedule and from the stage's session (a requested window), nowhere else."""

from __future__ import annotations

from pathlib import Path

import neuron_mlflow as nm
from neuron_mlflow.engine.options import Options
from neuron_mlflow.engine.session import ProfilingSession
from neuron_mlflow.engine.stages import StageWindows


def _windows(tmp_path: Path, schedule: nm.Schedule) -> StageWindows:
    config = nm.ProfilerConfig(
        backend="cpu", local_dir=str(tmp_path), schedule=schedule, poll_s=0,
        capture_signal=None,
    )  # fmt: skip
    options = Options(config, rank=0, world_size=1, attached=True)
    return StageWindows(
        config, "profile/train",
        lambda: ProfilingSession(options, prefix="profile/train", upload=False),
    )  # fmt: skip


def _step(windows: StageWindows, step: int) -> tuple[bool, bool]:
    """One step as a front end runs it: (begun quietly, ended quietly)."""
    quiet_begin = windows.begin_quiet(step)
    if not quiet_begin:
        windows.begin(step)
    quiet_end = windows.end_quiet()
    if not quiet_end:
        windows.end(step + 1)
    return quiet_begin, quiet_end


def test_a_requested_window_makes_only_its_own_steps_leave_the_fast_path(tmp_path) -> None:
    windows = _windows(tmp_path, nm.Schedule(skip_first=1000, warmup=1, active=1))
    assert windows.quiet_until == 1000
    for step in range(3):
        assert _step(windows, step) == (True, True)
    window = windows.request_window(steps=2, warmup=1, start=5, reason="r")
    assert windows.quiet_until == 5
    quiet = [_step(windows, step) == (True, True) for step in range(3, 12)]
    assert quiet == [True, True, False, False, False, True, True, True, True]
    session = windows.session
    assert session is not None and not session.window_open
    assert session.wait_summaries(60)
    (record,) = session.records
    assert (record.window.steps, record.window.reason) == (window.last - window.first + 1, "r")
    assert windows.quiet_until == 1000  # the schedule's window again
    assert windows.done == set()  # a requested window is no scheduled window
    windows.close()


def test_a_done_window_still_ends_on_every_rank_even_without_a_session(tmp_path) -> None:
    config = nm.ProfilerConfig(
        backend="cpu",
        local_dir=str(tmp_path),
        schedule=nm.Schedule(wait=2, warmup=1, active=2, repeat=2),
    )
    windows = StageWindows(config, "profile/train", lambda: None)  # this rank: no capture
    quiet = [_step(windows, step) == (True, True) for step in range(12)]
    assert windows.done == {0, 1}
    assert quiet == [True, True] + [False] * 3 + [True, True] + [False] * 3 + [True, True]
