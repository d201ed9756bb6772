"""Errors and warnings of neuron-mlflow: the one tree every exception class of the package is in.

The hierarchy::

    NeuronMlflowError                    base of everything raised here
    ├── ConfigError (ValueError)         a configuration value is invalid
    ├── BackendUnavailableError          the requested backend cannot run on this machine
    │   (RuntimeError)
    ├── TraceFormatError (ValueError)    a trace file is truncated or not a Chrome/Kineto trace
    ├── IngestError (ValueError)         bad input to ``ingest``: no traces, an unknown run
    ├── CompareError (ValueError)        a run cannot be compared: unknown id, no profile
    ├── DownloadError (ValueError)       the run or window to download does not exist
    ├── WindowRequestRefused             a window asked for outside the schedule cannot be taken
    ├── BadRequest (ValueError)          a capture request cannot be read (it is answered
    │                                    ``refused: <why>``)
    └── OutOfOrder                       internal: the trace engine's streaming pass hands over
                                         to the exact buffered pass (never reaches users)

    NeuronMlflowWarning (UserWarning)    our own code failed; the user's job goes on

Every message has three parts: what was wrong, the value received, and the allowed
values or the next step. The CLI maps ``ConfigError``, ``TraceFormatError``, ``IngestError``,
``CompareError`` and ``DownloadError`` to exit code 2.

Example:
    >>> bad_input = (ConfigError, TraceFormatError, IngestError, CompareError, DownloadError)
    >>> all(issubclass(e, NeuronMlflowError) and issubclass(e, ValueError) for e in bad_input)
    True
    >>> err = BadRequest("steps=0 is below 1", "a1")
    >>> err.request_id, isinstance(err, ValueError), str(err)
    ('a1', True, 'steps=0 is below 1')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class NeuronMlflowError(Exception):
    """Base class of every error raised by neuron-mlflow.

    Example:
        >>> try:
        ...     raise NeuronMlflowError("something went wrong")
        ... except NeuronMlflowError as err:
        ...     print(err)
        something went wrong
    """


class ConfigError(NeuronMlflowError, ValueError):
    """A configuration value is invalid.

    Raised by :class:`~neuron_mlflow.ProfilerConfig` and its nested models. The message names
    each bad field, the value received and what is allowed; ``errors`` keeps pydantic's
    structured list.

    Example:
        >>> from neuron_mlflow import ProfilerConfig
        >>> try:
        ...     ProfilerConfig(backend="tpu")
        ... except ConfigError as err:
        ...     print(str(err).splitlines()[1])
          backend: got 'tpu'; Input should be 'auto', 'neuron', 'cuda' or 'cpu'
    """

    def __init__(self, message: str, errors: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])


class BackendUnavailableError(NeuronMlflowError, RuntimeError):
    """The requested profiling backend cannot run on this machine.

    Example:
        >>> err = BackendUnavailableError("backend='cuda' needs a CUDA device; none is visible")
        >>> isinstance(err, RuntimeError)
        True
    """


class TraceFormatError(NeuronMlflowError, ValueError):
    """A trace file is truncated or is not a Chrome/Kineto JSON trace."""


class IngestError(NeuronMlflowError, ValueError):
    """Bad input to ``ingest`` (exit code 2): no traces, an unknown run."""


class CompareError(NeuronMlflowError, ValueError):
    """A run cannot be compared: unknown id, or no profile metrics (exit code 2)."""


class DownloadError(NeuronMlflowError, ValueError):
    """The run or window to download does not exist (exit code 2)."""


class OutOfOrder(NeuronMlflowError):
    """The trace engine's streaming pass met events it cannot place exactly; ``summarize_trace``
    catches it and the buffered pass takes over."""


class WindowRequestRefused(NeuronMlflowError):
    """A window asked for outside the schedule cannot be taken; the message says why."""


class BadRequest(NeuronMlflowError, ValueError):
    """A capture request that cannot be read; ``request_id`` answers it all the same."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class NeuronMlflowWarning(UserWarning):
    """Warning for failures of neuron-mlflow's own code; the user's job goes on.

    Example:
        >>> issubclass(NeuronMlflowWarning, UserWarning)
        True
    """
