"""One live window: the ``torch.profiler`` capture of the steps of one scheduled window.

Its schedule mirrors :mod:`neuron_mlflow.schedule` for just this window; at its end the
backend writes the trace into the window's staging folder (``on_trace_ready``).

Example:
    >>> import tempfile, time, torch
    >>> from pathlib import Path
    >>> from neuron_mlflow.capture.backends import resolve_backend
    >>> from neuron_mlflow.config import ProfilerConfig, Schedule
    >>> from neuron_mlflow.schedule import window_at
    >>> cfg = ProfilerConfig(backend="cpu", schedule=Schedule(warmup=0, active=1))
    >>> staging = Path(tempfile.mkdtemp())
    >>> live = LiveWindow(window_at(cfg.schedule, 0), resolve_backend("cpu", cfg), cfg,
    ...                   staging, staging / "traces" / "rank_0")
    >>> live.start()
    >>> _ = torch.ones(4) * 2
    >>> live.record_step(0, time.perf_counter_ns())
    >>> live.step()
    >>> live.stop()
    >>> live.recorded_steps, any((staging / "traces" / "rank_0").iterdir())
    (1, True)
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.capture.backends.base import BaseBackend
from neuron_mlflow.capture.interference import InterferenceProbe, Sample
from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.naming import RECORDED_STEPS_KEY, STEP_INTERFERENCE_KEY
from neuron_mlflow.schedule import Window, window_action

if TYPE_CHECKING:
    import torch.profiler


@dataclass
class LiveWindow:
    """A running window: its profiler and what it has recorded so far.

    Attributes:
        staging: the window's staging folder in the spool.
        trace_dir: where the backend writes this rank's trace (under ``staging``).
        recorded_steps: steps recorded so far; ``last_recorded`` the last one's number.
        wall_ns: summed wall time of the recorded steps.
        errors: our failures while capturing the window (kept in its record).
    """

    window: Window
    backend: BaseBackend
    config: ProfilerConfig
    staging: Path
    trace_dir: Path
    recorded_steps: int = 0
    last_recorded: int = -1
    wall_ns: int = 0
    errors: list[str] = field(default_factory=list)
    marker: Any = None
    prof: Any = None
    stopped: Any = None
    """The profiler once stopped, until :meth:`release` frees it."""
    host_load: Any = None
    """The host's load sampled when the window opened (the engine's ``HostLoad``)."""
    reason: str = "schedule"
    """Why the window was taken: ``schedule``, ``request <id>``, ``slow steps: 1.7x median``."""
    probe: InterferenceProbe = field(default_factory=InterferenceProbe)
    """Run-queue wait and involuntary switches per step (:mod:`.interference`)."""
    step_start: Sample | None = None
    interference: list[list[float | int | None]] = field(default_factory=list)
    """Per recorded step ``[cpu_wait_us, switches]``, also in the trace's metadata."""

    def record_step(self, step: int, started_ns: int) -> None:
        """Count ``step`` as recorded, with its wall time since ``started_ns``."""
        self.wall_ns += time.perf_counter_ns() - started_ns
        self.recorded_steps += 1
        self.last_recorded = step
        if self.step_start is not None:
            wait_us, switches = self.probe.since(self.step_start)
            self.interference.append([None if wait_us is None else round(wait_us, 1), switches])
        else:
            self.interference.append([None, None])
        self.step_start = None
        if self.prof is not None:  # for steps.jsonl (its `disturbed`) and the step count
            try:
                self.prof.add_metadata_json(RECORDED_STEPS_KEY, str(self.recorded_steps))
                self.prof.add_metadata_json(STEP_INTERFERENCE_KEY, json.dumps(self.interference))
            except Exception as exc:  # an old torch: the trace's step ranges count instead
                self.errors.append(f"tagging the trace failed: {type(exc).__name__}: {exc}")

    def _torch_schedule(self, relative_step: int) -> torch.profiler.ProfilerAction:
        import torch.profiler

        step = self.window.start + relative_step
        if step > self.window.last:
            return torch.profiler.ProfilerAction.NONE
        return torch.profiler.ProfilerAction[window_action(self.window, step).name]

    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        # only the export, on the training thread: torch's event tree is never built
        try:
            self.backend.export_trace(prof, self.trace_dir)
        except Exception as exc:
            self.errors.append(f"writing the trace failed: {type(exc).__name__}: {exc}")

    def start(self) -> None:
        """Create and start the profiler (its schedule begins at the window's first step)."""
        import torch.profiler

        cfg = self.config
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prof = torch.profiler.profile(
                activities=self.backend.activities(),
                schedule=self._torch_schedule,
                on_trace_ready=self._on_trace_ready,
                record_shapes=cfg.record_shapes,
                with_stack=cfg.with_stack,
                profile_memory=cfg.profile_memory,
                with_flops=cfg.with_flops,
                **self.backend.profiler_kwargs(cfg, self.trace_dir),
            )
            prof.start()
        self.prof = prof
        self.probe.open()  # the threads torch's pools started by now

    def step(self) -> None:
        """Advance the profiler's schedule by one step (``prof.step()``)."""
        self.prof.step()

    def enter_marker(self, name: str) -> None:
        """Open a ``record_function`` range around one step's own work."""
        import torch.profiler

        marker = torch.profiler.record_function(name)
        marker.__enter__()
        self.marker = marker

    def exit_marker(self) -> None:
        """Close the range opened by :meth:`enter_marker`, if any."""
        if self.marker is not None:
            marker, self.marker = self.marker, None
            marker.__exit__(None, None, None)

    def stop(self) -> None:
        """Stop the profiler; torch calls ``on_trace_ready`` if a recorded step is pending."""
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        self.probe.close()
        self.stopped = prof  # freed by release(), not by whichever step the collector runs in
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prof.stop()

    def release(self) -> None:
        """Free the stopped profiler now. ``torch.profiler.profile`` holds its own bound
        methods (a reference cycle): left to the cycle collector, it would be freed, with
        the window's results, inside whichever later step the collector runs in."""
        prof, self.stopped = self.stopped, None
        if prof is not None:
            prof.__dict__.clear()  # the cycle broken: refcounting frees it all here
