"""The pure schedule agrees with torch.profiler.schedule step by step."""

from __future__ import annotations

import itertools

import pytest
import torch.profiler

from neuron_mlflow import Schedule
from neuron_mlflow.schedule import (
    action_at,
    next_window_start,
    window_at,
)

GRID = list(
    itertools.product(
        [0, 2],  # skip_first
        [0, 1, 3],  # wait
        [0, 1, 2],  # warmup
        [1, 3],  # active
        [1, 2],  # repeat (torch's 0 means unlimited too)
    )
)


@pytest.mark.parametrize(("skip_first", "wait", "warmup", "active", "repeat"), GRID)
def test_actions_match_torch_profiler_schedule(skip_first, wait, warmup, active, repeat) -> None:
    ours = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    theirs = torch.profiler.schedule(
        skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
    )
    for step in range(40):
        assert action_at(ours, step).name == theirs(step).name, step


def test_unlimited_repeat_never_finishes() -> None:
    s = Schedule(wait=1, warmup=0, active=1, repeat=0)
    assert [window_at(s, i) is not None for i in range(6)] == [False, True] * 3
    assert next_window_start(s, 10_000) == 10_001


def test_window_bounds_and_next_start() -> None:
    s = Schedule(skip_first=1, wait=2, warmup=1, active=3, repeat=2)
    first = window_at(s, 4)
    assert (first.index, first.start, first.first, first.last) == (0, 3, 4, 6)
    assert first.active_steps == 3
    assert next_window_start(s, 0) == 3
    assert next_window_start(s, 4) == 9
    assert next_window_start(s, 10) is None
