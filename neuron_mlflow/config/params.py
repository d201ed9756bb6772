"""The configuration as MLflow params, and byte sizes as people write them.

Which fields a window's params hold: docs/metrics.md.

Example:
    >>> flatten({"schedule": {"active": 3}, "top_k": 20})
    {'schedule.active': '3', 'top_k': '20'}
    >>> parse_size("500MB"), parse_size("1 GiB"), parse_size(4096)
    (500000000, 1073741824, 4096)
"""

from __future__ import annotations

import re
from typing import Any

_UNITS = {
    "": 1,
    "B": 1,
    **{f"{prefix}B": 1000 ** (power + 1) for power, prefix in enumerate("KMGT")},
    **{f"{prefix}IB": 1024 ** (power + 1) for power, prefix in enumerate("KMGT")},
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def flatten(document: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested ``model_dump(mode="json")`` output as ``{"a.b": "value"}``, every leaf a string."""
    out: dict[str, str] = {}
    for key, value in document.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def parse_size(value: Any) -> int | None:
    """A byte count from an int or a string such as ``"500MB"``, ``"2 GiB"``, ``"1048576"``.

    ``None``, ``""`` and ``"none"`` mean no limit (``None``). Decimal units are powers of
    1000 (KB, MB, GB, TB), binary ones powers of 1024 (KiB, MiB, GiB, TiB).

    Raises:
        ValueError: the value is not a size; the message names it and the accepted forms.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        if value.strip().lower() in {"", "none"}:
            return None
        match = _SIZE.match(value)
        if match and match.group(2).upper() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    raise ValueError(
        f"{value!r} is not a size in bytes: write a whole number of bytes (1048576) or a number"
        " with a unit (500MB, 2GiB; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024)"
    )
