"""Errors raised by neuron-mlflow.

The hierarchy::

    NeuronMlflowError                 base of everything raised here
    ├── ConfigError (ValueError)      a configuration value is invalid
    └── BackendUnavailableError       the requested backend cannot run on this machine

Every message has three parts: what was wrong, the value received, and the allowed
values or the next step.

Example:
    >>> from neuron_mlflow.errors import ConfigError, NeuronMlflowError
    >>> issubclass(ConfigError, NeuronMlflowError) and issubclass(ConfigError, ValueError)
    True
"""

from __future__ import annotations


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

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class BackendUnavailableError(NeuronMlflowError, RuntimeError):
    """The requested profiling backend cannot run on this machine.

    Example:
        >>> err = BackendUnavailableError("backend='cuda' needs a CUDA device; none is visible")
        >>> isinstance(err, RuntimeError)
        True
    """
