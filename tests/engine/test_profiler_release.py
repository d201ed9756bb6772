"""A window's stopped profiler is freed when the next window opens (before its profiler
starts) and at close: never left to Python's cycle collector, which would free it, and the
window's results, inside whichever later step it ran in (30 ms in the steps after a large
Lightning window: ``benchmarks/window_end.py``)."""

from __future__ import annotations

import gc
import weakref

import torch

from neuron_mlflow import ProfilerConfig, Schedule
from neuron_mlflow.engine.session import ProfilingSession


def test_the_stopped_profiler_is_freed_at_the_next_open_and_at_close(tmp_path) -> None:
    config = ProfilerConfig(
        backend="cpu", schedule=Schedule(warmup=1, active=2, repeat=2), local_dir=str(tmp_path)
    )
    session = ProfilingSession(config, upload=False)
    gc.collect()
    gc.disable()  # only reference counting frees anything below
    try:
        freed = []
        for step in range(6):
            session.begin_step()
            torch.ones(8).mul_(2.0)
            session.end_step()
            if step in (2, 5):  # a window's last step: stopped, kept for now
                stopped = session._stopped
                assert stopped is not None and stopped.stopped is not None
                # its results (the autograd profiler's, the trace's events), not the shell:
                # a caught exception of torch's own can keep that in a garbage cycle
                freed.append(weakref.ref(stopped.stopped.profiler))
                assert freed[-1]() is not None, "not freed in the step that ends the window"
            if step == 3:  # the next window opened (its warm-up step)
                assert freed[0]() is None, "freed when the next window opened"
        assert freed[1]() is not None
        session.close()
        assert freed[1]() is None, "freed at close"
    finally:
        gc.enable()
