"""Facts about the process that go into run tags and ``summary.json``.

Example:
    >>> tags = environment_tags({"backend": "cpu", "device": "x86_64"})
    >>> tags["neuron_mlflow.backend"], tags["neuron_mlflow.rank"]
    ('cpu', '0')
"""

from __future__ import annotations

import functools
import os
import socket
from importlib import metadata

from neuron_mlflow.naming import TAG_PREFIX


@functools.cache  # read once: a metadata lookup scans site-packages (ms, at every window end)
def package_version() -> str:
    """The installed neuron-mlflow version (``0+unknown`` when run from a bare checkout).

    Example:
        >>> isinstance(package_version(), str)
        True
    """
    try:
        return metadata.version("neuron-mlflow")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Global rank and world size: as given when both are, else from ``torch.distributed``
    when initialised, else the ``RANK`` / ``WORLD_SIZE`` environment variables of torchrun,
    else ``(0, 1)``.

    Example:
        >>> rank_and_world_size(), rank_and_world_size(1, 2)
        ((0, 1), (1, 2))
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def environment_tags(
    backend_facts: dict[str, str], rank: int = 0, world_size: int = 1
) -> dict[str, str]:
    """Run tags (``neuron_mlflow.<fact>``): the backend's facts (``BaseBackend.describe()``),
    torch and neuron-mlflow versions, host, global rank and world size."""
    import torch

    facts = {
        **backend_facts,
        "torch_version": torch.__version__,
        "version": package_version(),
        "host": socket.gethostname(),
        "rank": str(rank),
        "world_size": str(world_size),
    }
    return {f"{TAG_PREFIX}{key}": str(value) for key, value in facts.items()}
