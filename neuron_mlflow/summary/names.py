"""Readable operator and kernel names for tables and reports (``docs/report.md``); the full
names stay in ``summary.csv``/``ops.csv``, ``summary.json`` and the report's tooltips.

:func:`short_name` folds a long demangled C++ name until it fits: ``void`` and the argument
list go and nested template arguments become ``<...>`` (up to ``SLACK_CHARS`` over, to keep the
first template arguments, which tell kernels apart), without the namespaces if needed; then the
first template arguments are cut; then every template argument list becomes ``<...>`` and the
namespaces go; last, the identifier is cut at a ``_``. A long name that is not C++ keeps its
start and its end.

Example:
    >>> short_name("aten::mul")
    'aten::mul'
    >>> short_name("void split_embedding_backward_codegen_rowwise_adagrad_weighted_kernel_"
    ...            "cta_per_row_1<c10::Half, float, c10::Half, 2ul, 32>("
    ...            "at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, long>)")
    'split_embedding_backward_codegen_rowwise_adagrad_...<...>'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_CHARS = 60
"""Names up to this many characters are shown unchanged."""
_CXX = re.compile(r"[A-Za-z0-9_][<(]")  # a template argument list or an argument list
SLACK_CHARS = 20
"""How far over ``MAX_CHARS`` a name may stay to keep its first template arguments."""


def _fold(name: str, keep_depth: int) -> str:
    """``name`` with template arguments deeper than ``keep_depth`` as ``...`` and the
    argument list (and whatever follows it) dropped; ``(anonymous namespace)`` stays."""
    out: list[str] = []
    angle = 0
    i = 0
    while i < len(name):
        char = name[i]
        if angle == 0 and char == "(":
            if not name.startswith("(anonymous namespace)", i):
                break  # the argument list: the rest is arguments and qualifiers
            out.append("(anonymous namespace)")
            i += len("(anonymous namespace)")
            continue
        if char == "<":
            angle += 1
            if angle <= keep_depth + 1:
                out.append("<")
            if angle == keep_depth + 1:
                out.append("...")
        elif char == ">" and angle:
            if angle <= keep_depth + 1:
                out.append(">")
            angle -= 1
        elif angle <= keep_depth:
            out.append(char)
        i += 1
    return "".join(out).strip()


def _without_namespaces(name: str) -> str:
    """Drop the ``a::b::`` qualifiers in front of the last identifier (outside ``<>``)."""
    depth, cut = 0, 0
    for i, char in enumerate(name):
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        elif depth == 0 and name.startswith("::", i):
            cut = i + 2
    return name[cut:] if name[cut:] else name


def _cut(name: str, max_chars: int) -> str:
    """Cut the identifier (before any ``<``/``(``) to fit, at a ``_`` boundary, with ``...``."""
    stop = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    ident, tail = name[:stop], name[stop:]
    room = max(max_chars - len(tail) - 3, 8)
    head = ident[:room]
    boundary = head.rfind("_")
    if boundary >= room // 2:
        head = head[: boundary + 1]
    return f"{head}...{tail}"


def short_name(name: str, max_chars: int = MAX_CHARS) -> str:
    """A display name of an operator or kernel name, at most about ``max_chars`` characters
    (shorter names unchanged), folded as the module docstring describes.

    Example:
        >>> short_name("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4>"
        ...            "(cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4::Params)")
        'cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4>'
    """
    if len(name) <= max_chars:
        return name
    bare = name[5:] if name.startswith("void ") else name
    if bare.startswith("<") or not _CXX.search(bare):  # not C++: keep the start and the end
        if len(bare) <= max_chars + SLACK_CHARS:
            return bare
        half = (max_chars - 3) // 2
        return f"{bare[:half]}...{bare[-half:]}"
    for folded in (_fold(bare, 1), _without_namespaces(_fold(bare, 1))):
        if len(folded) <= max_chars + SLACK_CHARS:  # keep the first template arguments
            return folded
    stop = folded.find("<")
    if 0 < stop <= max_chars - 12:  # the first template arguments, cut
        return f"{folded[: max_chars + SLACK_CHARS - 4].rstrip('.<')}...>"
    folded = _without_namespaces(_fold(bare, 0))
    if len(folded) <= max_chars:
        return folded
    return _cut(folded, max_chars)


def display_names(names: Iterable[str], max_chars: int = MAX_CHARS) -> dict[str, str]:
    """Short names for the names of one table, distinct: repeats get `` [2]``, `` [3]``...

    Example:
        >>> first = "void kernel<" + "float, " * 20 + "int>(int)"
        >>> second = "void kernel<" + "float, " * 20 + "half>(int)"
        >>> names = display_names([first, second, "aten::mul"])
        >>> names[first] + " | " + names[second]  # doctest: +ELLIPSIS
        'kernel<float, float, ...> | kernel<float, float, ...> [2]'
    """
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for name in dict.fromkeys(names):
        short = short_name(name, max_chars)
        count = seen.get(short, 0) + 1
        seen[short] = count
        out[name] = short if count == 1 else f"{short} [{count}]"
    return out
