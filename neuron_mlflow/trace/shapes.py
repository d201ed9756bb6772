"""Input shapes and FLOPs of trace operators (``record_shapes``/``with_flops`` traces).

torch writes no FLOPs into the trace; :func:`flops` estimates them from the shapes with
torch's own formulas (``computeFlops`` in ``torch/csrc/profiler/util.cpp``; docs/metrics.md).

Example:
    >>> flops("aten::mm", "[[32, 64], [64, 16]]", None)
    65536
    >>> flops("aten::relu", "[[32, 64]]", None) is None
    True
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

_MATRICES = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1}
"""Matrix products: the index of their first matrix input."""
FLOP_OPS = frozenset({*_MATRICES, "aten::conv2d", "aten::mul", "aten::add"})
"""Operators torch estimates FLOPs for (others have none)."""
_LISTS_OF_INTS = re.compile(r"[\[\]0-9, ]*")
"""Text that can only be (nested) lists of non-negative integers, as torch writes shapes."""


def _loads(text: str) -> Any:
    """``json.loads(text)`` (same values, same ``ValueError``), faster on the usual shapes."""
    if _LISTS_OF_INTS.fullmatch(text):
        return msgspec.json.decode(text)  # its DecodeError is a ValueError
    return json.loads(text)


def _ints(text: str) -> list[int] | None:
    try:
        value = _loads(text)
    except ValueError:
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None


def _conv2d(dims: list[Any], concrete: list[Any]) -> int | None:
    if len(dims) < 2 or len(dims[0]) != 4 or len(dims[1]) != 4 or len(concrete) < 7:
        return None
    stride, padding, dilation, groups = (_ints(str(c)) for c in concrete[3:7])
    if not (stride and padding and dilation and groups) or groups[0] == 0:
        return None
    n, c_in, h, w = dims[0]
    c_out, _, kh, kw = dims[1]
    stride, padding, dilation = ([v[0], v[-1]] for v in (stride, padding, dilation))
    out_h = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return int(2 * n * out_h * out_w * kh * kw * c_in * c_out // groups[0])


def flops(name: str, input_dims: str, concrete_inputs: str | None) -> int | None:
    """FLOPs of one call of ``name`` with these inputs, or ``None`` if torch counts none.

    Args:
        input_dims: the trace's ``Input Dims`` (JSON text).
        concrete_inputs: the trace's ``Concrete Inputs`` (JSON text), needed for conv2d.

    Example:
        >>> flops("aten::conv2d", "[[2, 3, 16, 16], [4, 3, 3, 3], [], [], [], [], []]",
        ...       '["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]')
        27648
    """
    if name not in FLOP_OPS:
        return None
    try:
        dims = _loads(input_dims)
    except ValueError:
        return None
    if not isinstance(dims, list) or not dims or not all(isinstance(d, list) for d in dims):
        return None
    if name == "aten::conv2d":
        try:
            concrete = _loads(concrete_inputs or "[]")
        except ValueError:
            return None
        return _conv2d(dims, concrete if isinstance(concrete, list) else [])
    if name in ("aten::mul", "aten::add"):
        return math.prod(dims[0])
    first = _MATRICES[name]
    if len(dims) < first + 2:
        return None
    a, b = dims[first], dims[first + 1]
    batched = name in ("aten::bmm", "aten::baddbmm")
    if len(a) != 2 + batched or len(b) != 2 + batched or a[-1] == 0 or (batched and a[0] == 0):
        return None
    return int(2 * math.prod(a) // a[-1] // (a[0] if batched else 1) * math.prod(b))


def shapes_text(input_dims: str) -> str:
    """The ``Input Dims`` text in one canonical spacing (the summary's shapes column).

    Example:
        >>> shapes_text("[[32,64],[64, 64], []]")
        '[[32, 64], [64, 64], []]'
    """
    try:
        if _LISTS_OF_INTS.fullmatch(input_dims):  # lists of integers, once checked valid:
            msgspec.json.decode(input_dims)  # json.dumps writes the same digits, ", " between
            return input_dims.replace(" ", "").replace(",", ", ")  # items, no other spaces
        return json.dumps(json.loads(input_dims))
    except ValueError:
        return input_dims
