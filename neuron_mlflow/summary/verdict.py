"""The verdict of a window and of its top operators: compute-, memory- or overhead-bound.

Pure, over numbers the window already has (percentages 0-100); the rule: ``docs/neuron.md``.

Example:
    >>> window_verdict(VerdictInputs(device_busy_pct=92.0, compute_pct=12.0, memory_pct=61.0))
    ('memory-bound', 'memory share 61.0 % > compute share 12.0 % (device busy 92.0 %)')
    >>> window_verdict(VerdictInputs(device_busy_pct=31.0))[0]
    'overhead-bound'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from neuron_mlflow.summary.ops import OpStats, OpSummary

BUSY_THRESHOLD_PCT = 50.0
"""Below this device busy share a window is overhead-bound."""
ALONE_THRESHOLD_PCT = 50.0
"""With only one share known, the share needed for its verdict."""
VERDICT_KEY = "verdict"
"""Key of the verdict document in ``OpSummary.extra``."""


@dataclass(frozen=True)
class VerdictInputs:
    """What the window verdict is decided from (percentages 0-100, ``None``: unknown)."""

    device_busy_pct: float | None = None
    compute_pct: float | None = None
    memory_pct: float | None = None


def window_verdict(inputs: VerdictInputs) -> tuple[str | None, str]:
    """The window's verdict and the reason (the rule: ``docs/neuron.md``).

    Example:
        >>> window_verdict(VerdictInputs())
        (None, 'no device busy share, compute share or memory share was measured')
    """
    busy, compute, memory = inputs.device_busy_pct, inputs.compute_pct, inputs.memory_pct
    busy_note = f" (device busy {busy:.1f} %)" if busy is not None else ""
    if busy is not None and busy < BUSY_THRESHOLD_PCT:
        return "overhead-bound", f"device busy {busy:.1f} % < {BUSY_THRESHOLD_PCT:.0f} %"
    if compute is not None and memory is not None:
        if compute >= memory:
            return "compute-bound", (
                f"compute share {compute:.1f} % >= memory share {memory:.1f} %{busy_note}"
            )
        return (
            "memory-bound",
            f"memory share {memory:.1f} % > compute share {compute:.1f} %{busy_note}",
        )
    for share, name, verdict in (
        (compute, "compute", "compute-bound"),
        (memory, "memory", "memory-bound"),
    ):
        if share is not None and share >= ALONE_THRESHOLD_PCT:
            return verdict, f"{name} share {share:.1f} % (the other is unknown){busy_note}"
    if compute is None and memory is None and busy is None:
        return None, "no device busy share, compute share or memory share was measured"
    return None, (
        "not enough device-level numbers (compute and memory shares need neuron-explorer's "
        f"summary or with_flops){busy_note}"
    )


def op_verdict(op: OpStats, flops: float | None = None) -> str | None:
    """One operator's verdict from its per-step numbers (the rule: ``docs/neuron.md``);
    ``None`` without device time.
    """
    if op.self_device_us is None or op.self_device_us <= 0:
        return None
    if op.self_cpu_us >= op.self_device_us:
        return "overhead-bound"
    return "compute-bound" if flops else "memory-bound"


def verdict_document(
    summary: OpSummary,
    inputs: VerdictInputs,
    flops_by_op: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The verdict of the window and of its first five operators, for ``summary.extra``.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 3, 60.9, 60.9, 1164.5, 1164.5)], 3, 1, 2e3,
        ...                   device_label="NEURON")
        >>> doc = verdict_document(s, VerdictInputs(device_busy_pct=40.0))
        >>> doc["window"], doc["ops"]
        ('overhead-bound', {'aten::mul': 'memory-bound'})
    """
    verdict, reason = window_verdict(inputs)
    flops = flops_by_op or {}
    ops = {op.name: found for op in summary.top(5) if (found := op_verdict(op, flops.get(op.name)))}
    return {"window": verdict, "reason": reason, "inputs": asdict(inputs), "ops": ops}


def verdict_lines(extra: dict[str, Any]) -> list[str]:
    """Markdown lines for ``summary.md``: the verdict, or why device-level numbers are absent.

    Example:
        >>> verdict_lines({"verdict": {"window": "memory-bound", "reason": "r", "ops": {"a": "x"}}})
        ['- Verdict: memory-bound (r)', '- Top operators: a: x']
        >>> verdict_lines({})
        []
    """
    lines: list[str] = []
    document = extra.get(VERDICT_KEY)
    if isinstance(document, dict):
        verdict = document.get("window") or "undetermined"
        lines.append(f"- Verdict: {verdict} ({document.get('reason', '')})")
        ops = document.get("ops") or {}
        if ops:
            lines.append("- Top operators: " + "; ".join(f"{n}: {v}" for n, v in ops.items()))
    for note in extra.get("device_notes") or []:
        lines.append(f"- {note}")
    return lines
