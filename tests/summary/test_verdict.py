"""The verdict rule: compute-, memory- or overhead-bound, per window and per operator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from neuron_mlflow.summary.ops import OpStats, RawOp, build_summary
from neuron_mlflow.summary.tables import render_markdown
from neuron_mlflow.summary.verdict import (
    VerdictInputs,
    op_verdict,
    verdict_document,
    window_verdict,
)


@pytest.mark.parametrize(
    ("busy", "compute", "memory", "verdict"),
    [
        (31.0, 90.0, 10.0, "overhead-bound"),  # idle between dispatches wins over all
        (92.0, 60.0, 20.0, "compute-bound"),
        (92.0, 12.0, 61.0, "memory-bound"),
        (None, 40.0, 40.0, "compute-bound"),  # a tie is compute-bound
        (80.0, 70.0, None, "compute-bound"),  # one share alone, at 50 % or more
        (80.0, None, 55.0, "memory-bound"),
        (80.0, 20.0, None, None),  # one share alone, below 50 %: undetermined
        (None, None, None, None),
    ],
)
def test_window_verdict_follows_the_documented_rule(busy, compute, memory, verdict) -> None:
    assert window_verdict(VerdictInputs(busy, compute, memory))[0] == verdict


def test_operator_verdicts() -> None:
    def op(cpu: float, device: float | None) -> OpStats:
        return OpStats("op", 1.0, cpu, cpu, 10.0, device, device, 50.0)

    assert op_verdict(op(60.0, 40.0)) == "overhead-bound"  # dispatch costs more than the work
    assert op_verdict(op(20.0, 400.0), flops=2e9) == "compute-bound"
    assert op_verdict(op(20.0, 400.0)) == "memory-bound"
    assert op_verdict(op(20.0, None)) is None


def test_summary_md_shows_the_verdict_and_the_top_operators() -> None:
    rows = [
        RawOp("aten::mul", 3, 60.9, 60.9, 1164.5, 1164.5),
        RawOp("aten::mm", 1, 5.0, 5.0, 900.0, 900.0, flops=4e9),
    ]
    summary = build_summary(rows, 4, 1, 3000.0, device_label="NEURON")
    flops = {op.name: op.flops for op in summary.ops if op.flops}
    document = verdict_document(summary, VerdictInputs(95.0, 12.0, 61.0), flops_by_op=flops)
    text = render_markdown(replace(summary, extra={"verdict": document}))
    assert "- Verdict: memory-bound (memory share 61.0 % > compute share 12.0 %" in text
    assert "- Top operators: aten::mul: memory-bound; aten::mm: compute-bound" in text
