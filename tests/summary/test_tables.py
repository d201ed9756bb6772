"""The op summary as pure data, including the seed's published RMSNorm numbers."""

from __future__ import annotations

import csv
import io

import pytest

from neuron_mlflow.summary.ops import RawOp, build_summary
from neuron_mlflow.summary.tables import format_us, render_csv, render_markdown, render_side_by_side

# The seed's key_averages() rows for the naive RMSNorm on Trainium (one profiled step).
SEED_NAIVE = [
    RawOp("aten::mul", 3, 60.9, 60.9, 1164.5, 1164.5),
    RawOp("aten::add", 1, 26.6, 26.6, 434.6, 434.6),
    RawOp("aten::rsqrt", 1, 15.6, 15.6, 415.0, 415.0),
    RawOp("aten::mean", 1, 21.1, 21.1, 340.8, 340.8),
]


def test_seed_naive_rmsnorm_table_is_reproduced() -> None:
    summary = build_summary(SEED_NAIVE, 6, 1, 3000.0, device_label="NEURON")
    assert [op.name for op in summary.ops] == [
        "aten::mul",
        "aten::add",
        "aten::rsqrt",
        "aten::mean",
    ]
    assert [round(op.device_pct, 1) for op in summary.ops] == [49.5, 18.5, 17.6, 14.5]
    assert summary.op_calls == 6
    assert format_us(summary.device_time_us) == "2.355 ms"
    table = render_markdown(summary)
    assert "| Name | Calls | Self CPU | Self NEURON | NEURON % |" in table
    assert "| aten::mul | 3 | 60.9 us | 1.165 ms | 49.5 % |" in table
    assert "| aten::mean | 1 | 21.1 us | 340.8 us | 14.5 % |" in table
    assert "Self NEURON time total: 2.355 ms" in table
    assert "Op calls (top-level dispatches): 6" in table


def test_seed_side_by_side_of_the_three_variants() -> None:
    naive = build_summary(SEED_NAIVE, 6, 1, 3000.0, device_label="NEURON")
    fused = build_summary(
        [RawOp("aten::_fused_rms_norm", 1, 47.6, 47.6, 403.3, 403.3)], 1, 1, 600.0, "NEURON"
    )
    compiled = build_summary(
        [RawOp("Torch-Compiled Region: 0/0", 1, 98.4, 98.4, 375.5, 375.5)], 1, 1, 700.0, "NEURON"
    )
    table = render_side_by_side({"naive": naive, "rms_norm": fused, "compiled": compiled})
    assert "| naive | 2354.9 | 124.2 | 6 | 3000.0 |" in table
    assert "| rms_norm | 403.3 | 47.6 | 1 | 600.0 |" in table
    assert "| compiled | 375.5 | 98.4 | 1 | 700.0 |" in table
    # fusion cuts device time to about one sixth, as the seed reports
    assert round(naive.device_time_us / fused.device_time_us, 1) == 5.8
    assert compiled.ops[0].device_pct == 100.0


def test_figures_are_per_step() -> None:
    summary = build_summary(
        [RawOp("aten::mul", 9, 90.0, 120.0, 30.0, 45.0)],
        top_level_calls=18,
        steps=3,
        wall_time_us=300.0,
        device_label="CUDA",
    )
    op = summary.ops[0]
    assert (op.calls, op.self_cpu_us, op.cpu_total_us) == (3.0, 30.0, 40.0)
    assert (op.self_device_us, op.device_total_us, op.device_pct) == (10.0, 15.0, 100.0)
    assert (summary.op_calls, summary.wall_time_us, summary.cpu_time_us) == (6.0, 100.0, 30.0)


def test_device_total_comes_from_device_rows_when_present() -> None:
    ops = [RawOp("aten::mm", 1, 5.0, 5.0, 8.0, 8.0), RawOp("aten::add", 1, 3.0, 3.0, 2.0, 2.0)]
    kernels = [RawOp("gemm_kernel", 1, 0.0, 0.0, 8.0, 8.0), RawOp("add_kernel", 1, 0, 0, 2.0, 2.0)]
    summary = build_summary(ops, 2, 1, 20.0, device_label="CUDA", device_rows=kernels)
    assert summary.device_time_us == 10.0
    assert [op.name for op in summary.ops] == ["aten::mm", "aten::add"]
    assert summary.ops[0].device_pct == pytest.approx(80.0)


def test_cpu_only_has_no_device_columns_and_sorts_by_cpu() -> None:
    summary = build_summary(
        [RawOp("aten::add", 1, 1.0, 1.0, 0.0, 0.0), RawOp("aten::mul", 1, 3.0, 3.0, 0.0, 0.0)],
        2,
        1,
        10.0,
    )
    assert summary.device_time_us is None
    assert all(op.self_device_us is None and op.device_pct is None for op in summary.ops)
    assert [op.name for op in summary.ops] == ["aten::mul", "aten::add"]
    assert [op.cpu_pct for op in summary.ops] == [75.0, 25.0]
    table = render_markdown(summary)
    assert "| Name | Calls | Self CPU | CPU % |" in table
    assert "Self CPU time total: 4.0 us" in table
    assert "device" not in table.lower()


def test_device_backend_with_all_zero_device_time_says_so() -> None:
    summary = build_summary([RawOp("aten::add", 1, 1.0, 1.0, 0.0, 0.0)], 1, 1, 5.0, "NEURON")
    assert summary.device_time_us is None
    assert summary.ops[0].self_device_us is None
    assert summary.device_note == "NEURON device time was not captured in this window"
    assert "NEURON device time was not captured" in render_markdown(summary)


def test_csv_has_every_op_with_key_and_blank_device_fields() -> None:
    summary = build_summary([RawOp("a::b", 2, 4.0, 6.0), RawOp("c", 1, 1.0, 1.0)], 3, 1, 9.0)
    rows = list(csv.DictReader(io.StringIO(render_csv(summary, {"a::b": "a.b", "c": "c"}))))
    assert [(r["name"], r["key"], r["calls"]) for r in rows] == [
        ("a::b", "a.b", "2.0"),
        ("c", "c", "1.0"),
    ]
    assert rows[0]["self_device_us"] == ""


def test_steps_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        build_summary([], 0, 0, 0.0)
