"""The guard around our own code: a failure of neuron-mlflow never stops the user's job.

A failure becomes one log record on the ``neuron_mlflow`` logger and one
:class:`~neuron_mlflow.errors.NeuronMlflowWarning`, which can never propagate into the
user's code (under ``python -W error`` the warning filter would raise it: it is swallowed
then, and the log record is the report). ``strict=True`` re-raises instead.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     guarded(False, int, "not a number") is None
    True
    >>> caught[0].category.__name__
    'NeuronMlflowWarning'
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error")  # as `python -W error` does
    ...     report("neuron-mlflow: a test report")  # no exception
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from typing import Any

from neuron_mlflow.errors import NeuronMlflowWarning

log = logging.getLogger("neuron_mlflow")


def report(message: str, stacklevel: int = 3) -> None:
    """One log record and one warning for ``message``; never raises."""
    with contextlib.suppress(Exception):
        log.warning(message)
    with contextlib.suppress(Warning):  # `-W error` turns the warning into an exception
        warnings.warn(message, NeuronMlflowWarning, stacklevel=stacklevel)


def guarded(
    strict: bool,
    fn: Any,
    *args: Any,
    on_failure: Callable[[BaseException], Any] | None = None,
) -> Any:
    """Call ``fn(*args)``; an exception becomes one report (``None`` returned), or is raised
    when ``strict``. ``on_failure`` (e.g. turning profiling off) runs before the report."""
    try:
        return fn(*args)
    except Exception as exc:
        if strict:
            raise
        if on_failure is not None:
            with contextlib.suppress(Exception):
                on_failure(exc)
        what = getattr(fn, "__qualname__", None) or repr(fn)
        off = "; profiling is off for this session" if on_failure is not None else ""
        report(
            f"neuron-mlflow: {what} failed: {type(exc).__name__}: {exc}{off}; "
            "the profiled code goes on",
            stacklevel=4,
        )
        return None
