"""The first front end: ``nm.profile`` as a decorator or a context manager.

Each call of a decorated function is one step; in a ``with`` block, each ``prof.step()``
ends one. The function returns what the original returns and raises what it raises.

Example:
    >>> import tempfile, torch
    >>> import neuron_mlflow as nm
    >>> @nm.profile(schedule=nm.Schedule(warmup=1, active=2), backend="cpu",
    ...             local_dir=tempfile.mkdtemp(), name="double")
    ... def double(x):
    ...     return x * 2
    >>> for _ in range(3):
    ...     y = double(torch.ones(4))
    >>> double.profiler.summary.op_calls, double.profiler.prefix
    (1.0, 'profile/double')
    >>> double.profiler.run_id is not None
    True
"""

from __future__ import annotations

import atexit
import functools
import re
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, overload

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.engine.options import Options
from neuron_mlflow.engine.session import ProfilingSession, wait_at_exit
from neuron_mlflow.errors import ConfigError
from neuron_mlflow.summary.ops import OpSummary

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_open_profilers: weakref.WeakSet[Profiler] = weakref.WeakSet()


@atexit.register
def _close_open_profilers() -> None:
    """At exit, a profiler nobody closed is closed and waits (at most ``upload_timeout_s``)
    for the worker, so that its run is complete when the script ends. A closed profiler is
    not waited for: the worker finishes its windows on its own (``wait()`` waits for them)."""
    profilers = list(_open_profilers)
    for profiler in profilers:
        profiler.close()
    wait_at_exit(profiler.session for profiler in profilers)


class Profiler:
    """A profiling session usable as a decorator or a context manager.

    Build it with :func:`profile`. As a decorator, each call of the function is one step;
    as a context manager, call :meth:`step` after each iteration.

    Attributes:
        config: the effective configuration.
        prefix: the metric prefix ``P``.
        session: the engine.
    """

    def __init__(
        self,
        config: ProfilerConfig | None = None,
        *,
        name: str | None = None,
        run_id: str | None = None,
        **overrides: Any,
    ) -> None:
        base = config if config is not None else ProfilerConfig()
        self.config = base.with_overrides(**overrides)
        if name is not None and not _NAME.match(name):
            raise ConfigError(
                f"invalid profile name {name!r}: it becomes part of the metric prefix; "
                "allowed characters are letters, digits, '_', '.' and '-'"
            )
        self.prefix = f"{self.config.metric_prefix}/{name}" if name else self.config.metric_prefix
        self.session = ProfilingSession(Options(self.config, run_id=run_id), prefix=self.prefix)
        _open_profilers.add(self)

    @property
    def summary(self) -> OpSummary | None:
        """The op summary of the last finished window (``None`` before the first)."""
        return self.session.summary

    @property
    def run_id(self) -> str | None:
        """The MLflow run the last window was logged to (``None`` if none was logged)."""
        return self.session.run_id

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``, default ``upload_timeout_s``) until the worker has
        uploaded this profiler's windows; True when none is left. Call it before measuring
        something else in the same process, so that our upload does not share the CPU with
        it."""
        timeout = self.config.upload_timeout_s if timeout_s is None else timeout_s
        return bool(self.session.guarded(self.session.wait, timeout))

    def step(self) -> None:
        """End one step and begin the next (inside a ``with`` block)."""
        self.session.guarded(self.session.step)

    def close(self) -> None:
        """Stop a window still open (logged as partial) and hand what is left to the worker
        process; nothing of ours keeps running here. It does not wait for the uploads (the
        worker finishes them, even after this process ends): call :meth:`wait` first to have
        them in MLflow. Idempotent."""
        self.session.guarded(self.session.close)
        _open_profilers.discard(self)

    def __enter__(self) -> Profiler:
        self.session.guarded(self.session.begin_step)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.session.guarded(self.session.abort, exc)
        self.close()

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call is one step. ``fn.profiler`` is this profiler."""
        session = self.session
        call_name = getattr(fn, "__qualname__", None) or repr(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # our code runs in the session's guard: a failure of ours is one report and
            # turns profiling off; the user's result and exceptions pass unchanged
            session.guarded(session.begin_step, call_name)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                session.guarded(session.abort, exc)
                raise
            session.guarded(session.end_step)
            return result

        wrapper.profiler = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]


@overload
def profile(fn: F, /) -> F: ...


@overload
def profile(
    fn: None = None,
    /,
    *,
    config: ProfilerConfig | None = None,
    name: str | None = None,
    run_id: str | None = None,
    **overrides: Any,
) -> Profiler: ...


def profile(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    config: ProfilerConfig | None = None,
    name: str | None = None,
    run_id: str | None = None,
    **overrides: Any,
) -> Any:
    """Profile a function (decorator) or a block (context manager) into MLflow.

    Args:
        fn: the function, when used bare as ``@nm.profile``.
        config: base configuration; defaults to ``ProfilerConfig()`` (environment, YAML file).
        name: metric prefix becomes ``<metric_prefix>/<name>``.
        run_id: the run to log into when no MLflow run is active.
        **overrides: ``ProfilerConfig`` fields overriding ``config``.

    Returns:
        The wrapped function (bare use) or a :class:`Profiler`.

    Raises:
        ConfigError: an override or ``name`` is invalid.
        BackendUnavailableError: the backend cannot run here.

    Example:
        >>> import tempfile, torch
        >>> import neuron_mlflow as nm
        >>> with nm.profile(backend="cpu", local_dir=tempfile.mkdtemp(),
        ...                 schedule=nm.Schedule(warmup=0, active=2)) as prof:
        ...     for _ in range(2):
        ...         _ = torch.ones(3) + 1
        ...         prof.step()
        >>> prof.summary.steps
        2
    """
    if fn is not None and not callable(fn):
        raise TypeError(
            f"profile() takes a function or keyword arguments only; got {fn!r}. "
            "Use @nm.profile or @nm.profile(backend='cpu', ...)"
        )
    profiler = Profiler(config, name=name, run_id=run_id, **overrides)
    return profiler if fn is None else profiler(fn)
