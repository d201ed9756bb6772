"""Profiling backends and how one is chosen.

``auto`` picks ``neuron``, then ``cuda``, then ``cpu``: the first whose
``unavailable_reason()`` is ``None``.

Example:
    >>> resolve_backend("cpu").name
    'cpu'
    >>> resolve_backend("auto").name in {"cpu", "cuda"}
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_mlflow.capture.backends.base import BaseBackend
from neuron_mlflow.capture.backends.cpu import CpuBackend
from neuron_mlflow.capture.backends.cuda import CudaBackend
from neuron_mlflow.capture.backends.neuron import NeuronBackend
from neuron_mlflow.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:
    from neuron_mlflow.config import ProfilerConfig

__all__ = ["BACKENDS", "BaseBackend", "resolve_backend"]

BACKENDS: dict[str, type[BaseBackend]] = {
    "neuron": NeuronBackend,
    "cuda": CudaBackend,
    "cpu": CpuBackend,
}
"""Backends by name, in the order ``auto`` tries them."""


def resolve_backend(name: str, config: ProfilerConfig | None = None) -> BaseBackend:
    """Return a ready backend for ``name`` (``auto``, ``neuron``, ``cuda`` or ``cpu``).

    Args:
        config: the profiling configuration the backend serves (Neuron options, tags).

    Raises:
        BackendUnavailableError: the backend cannot run here; the message says what is
            missing.
        ConfigError: ``name`` is not a backend name.

    Example:
        >>> resolve_backend("tpu")
        Traceback (most recent call last):
        ...
        neuron_mlflow.errors.ConfigError: unknown backend 'tpu'; allowed: auto, neuron, cuda, cpu
    """
    if name == "auto":  # the cpu backend, last, is always available
        return next(cls for cls in BACKENDS.values() if cls.unavailable_reason() is None)(config)
    cls = BACKENDS.get(name)
    if cls is None:
        raise ConfigError(f"unknown backend {name!r}; allowed: auto, neuron, cuda, cpu")
    reason = cls.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    return cls(config)
