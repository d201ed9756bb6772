"""What makes timings noisy on a shared host, sampled at a window's open and close: the
window's ``naming.HOST_LOAD_TAGS``, which ``compare`` reads (docs/comparing.md).

Example:
    >>> start = sample_host_load()
    >>> tags = host_load_tags(start, sample_host_load())
    >>> set(tags) <= set(HOST_LOAD_TAGS.values())
    True
    >>> int(tags["neuron_mlflow.host_load.cpu_count"]) >= 1
    True
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from neuron_mlflow.naming import HOST_LOAD_TAGS


@dataclass(frozen=True)
class HostLoad:
    """One sample: CPU jiffies (steal, total) from ``/proc/stat`` (``None`` off Linux), the
    load averages, the CPU count, torch's threads (``None`` when torch is not imported)."""

    steal: int | None
    total: int | None
    load_avg_1m: float | None
    cpu_count: int
    torch_threads: int | None


def _proc_stat() -> tuple[int | None, int | None]:
    """(steal, total) jiffies of the first line: ``cpu user nice system idle iowait irq
    softirq steal guest guest_nice`` (guests are counted in user)."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = [int(x) for x in stat.read(256).split(b"\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None, None
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def sample_host_load() -> HostLoad:
    """Sample the host's load now (microseconds of work; never raises)."""
    steal, total = _proc_stat()
    try:
        load: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    torch = sys.modules.get("torch")  # (not imported here)
    try:
        threads = None if torch is None else int(torch.get_num_threads())
    except Exception:
        threads = None
    return HostLoad(steal, total, load, os.cpu_count() or 1, threads)


def host_load_tags(start: HostLoad, end: HostLoad) -> dict[str, str]:
    """The window's host-load tags from its open and close samples.

    Example:
        >>> a = HostLoad(100, 1000, 0.5, 2, None)
        >>> b = HostLoad(150, 1200, 1.25, 2, 4)
        >>> host_load_tags(a, b)  # doctest: +NORMALIZE_WHITESPACE
        {'neuron_mlflow.host_load.load_avg_1m': '1.25',
         'neuron_mlflow.host_load.cpu_count': '2',
         'neuron_mlflow.host_load.cpu_steal_pct': '25.0',
         'neuron_mlflow.host_load.torch_threads': '4'}
    """
    tags = {}
    if end.load_avg_1m is not None:
        tags[HOST_LOAD_TAGS["load_avg_1m"]] = f"{end.load_avg_1m:.2f}"
    tags[HOST_LOAD_TAGS["cpu_count"]] = str(end.cpu_count)
    if None not in (start.steal, start.total, end.steal, end.total):
        total = end.total - start.total  # type: ignore[operator]
        steal = end.steal - start.steal  # type: ignore[operator]
        if total > 0:
            tags[HOST_LOAD_TAGS["cpu_steal_pct"]] = f"{100.0 * steal / total:.1f}"
    threads = end.torch_threads if end.torch_threads is not None else start.torch_threads
    if threads is not None:
        tags[HOST_LOAD_TAGS["torch_threads"]] = str(threads)
    return tags
