"""The guard around our own code: a failure of neuron-mlflow never stops the user's job; it
is reported instead (docs/spool.md, "Never hurting the training job").

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Guard(False)(int, "not a number") is None
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
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from neuron_mlflow.errors import NeuronMlflowWarning

log = logging.getLogger("neuron_mlflow")
log.addHandler(logging.NullHandler())  # not printed twice by the last-resort handler

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def report(message: str) -> None:
    """One log record and one warning for ``message``, the warning attributed to the first
    frame outside this package (the user's line); never raises."""
    with contextlib.suppress(Exception):
        log.warning(message)
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    try:
        warnings.warn(message, NeuronMlflowWarning, stacklevel=level)
    except Warning:  # `-W error` turns the warning into an exception: say it anyway
        with contextlib.suppress(Exception):
            print(message, file=sys.stderr)


P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Guard:
    """Runs our own code so that its failure never reaches the user's job.

    Args:
        strict: re-raise instead of reporting.
        on_failure: runs before the report (e.g. turning profiling off).

    Example:
        >>> Guard(strict=False)(int, "12")
        12
    """

    strict: bool
    on_failure: Callable[[BaseException], object] | None = None

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        """``fn(*args, **kwargs)``; an exception becomes one report (``None`` returned), or is
        raised when ``strict``."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if self.strict:
                raise
            if self.on_failure is not None:
                with contextlib.suppress(Exception):
                    self.on_failure(exc)
            what = getattr(fn, "__qualname__", None) or repr(fn)
            off = "; profiling is off for this session" if self.on_failure is not None else ""
            report(
                f"neuron-mlflow: {what} failed: {type(exc).__name__}: {exc}{off}; "
                "the profiled code goes on"
            )
            return None
