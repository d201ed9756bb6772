"""The guard around our own code: a failure of neuron-mlflow never stops the user's job.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     guarded(False, int, "not a number") is None
    True
    >>> caught[0].category.__name__
    'NeuronMlflowWarning'
"""

from __future__ import annotations

import warnings
from typing import Any

from neuron_mlflow.errors import NeuronMlflowWarning


def guarded(strict: bool, fn: Any, *args: Any) -> Any:
    """Call ``fn(*args)``; an exception becomes one warning (``None`` returned), or is raised
    when ``strict``."""
    try:
        return fn(*args)
    except Exception as exc:
        if strict:
            raise
        warnings.warn(
            f"neuron-mlflow: {getattr(fn, '__qualname__', fn)} failed: "
            f"{type(exc).__name__}: {exc}; the profiled code goes on",
            NeuronMlflowWarning,
            stacklevel=4,
        )
        return None
