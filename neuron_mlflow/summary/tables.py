"""Renderings of an op summary: Markdown in the seed's layout, CSV, and the side-by-side table.

Example:
    >>> from neuron_mlflow.summary.ops import RawOp, build_summary
    >>> s = build_summary([RawOp("aten::mul", 1, 2.0, 2.0)], 1, 1, 1.0)
    >>> render_markdown(s).splitlines()[0]
    '| Name | Calls | Self CPU | CPU % |'
"""

from __future__ import annotations

import csv
import io
from dataclasses import fields

from neuron_mlflow.summary.names import display_names
from neuron_mlflow.summary.ops import OpStats, OpSummary
from neuron_mlflow.summary.verdict import verdict_lines


def format_us(us: float) -> str:
    """Format microseconds the way ``key_averages().table()`` does (us, ms or s).

    Example:
        >>> format_us(60.94), format_us(2354.9), format_us(2_500_000)
        ('60.9 us', '2.355 ms', '2.500 s')
    """
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1_000_000:
        return f"{us / 1000:.3f} ms"
    return f"{us / 1_000_000:.3f} s"


def render_markdown(summary: OpSummary, title: str | None = None) -> str:
    """The summary as a Markdown table in the seed's layout (short names), with totals below."""
    lines = [f"## {title}", ""] if title else []
    label = summary.device_label
    names = display_names(op.name for op in summary.ops)
    shapes = any(op.input_shapes for op in summary.ops)  # the extra columns, where recorded
    flops = summary.flops_per_step is not None
    has_device = summary.has_device_time
    share_head = f"Self {label} | {label} %" if has_device else "CPU %"
    head = " Input shapes |" * shapes + " FLOPs |" * flops
    lines.append(f"| Name | Calls | Self CPU | {share_head} |{head}")
    lines.append("|---|---:|---:|---:|" + "---:|" * has_device + "---|" * shapes + "---:|" * flops)
    for op in summary.ops:
        share = (
            f"{format_us(op.self_device_us or 0.0)} | {op.device_pct or 0.0:.1f} %"
            if has_device
            else f"{op.cpu_pct:.1f} %"
        )
        row = f"| {names[op.name]} | {op.calls:g} | {format_us(op.self_cpu_us)} | {share} |"
        if shapes:
            row += f" {op.input_shapes or ''} |"
        if flops:
            row += f" {op.flops:.4g} |" if op.flops is not None else " |"
        lines.append(row)
    lines.append("")
    lines.append(f"Per profiled step, over {summary.steps} step(s):")
    lines.append("")
    lines.append(f"- Self CPU time total: {format_us(summary.cpu_time_us)}")
    if has_device:
        lines.append(f"- Self {label} time total: {format_us(summary.device_time_us or 0.0)}")
    elif summary.device_note:
        lines.append(f"- {summary.device_note}")
    lines.append(f"- Wall time: {format_us(summary.wall_time_us)}")
    lines.append(f"- Op calls (top-level dispatches): {summary.op_calls:g}")
    if flops:
        lines.append(f"- FLOPs: {summary.flops_per_step:.4g} per step")
    for device, peak in summary.peak_allocated_bytes.items():
        lines.append(f"- Peak allocated memory ({device}): {peak / 2**20:.2f} MiB")
    if summary.partial:
        lines.append("- Partial window: it ended before its last scheduled step")
    lines.extend(verdict_lines(summary.extra))  # Neuron: the verdict, or why it is absent
    return "\n".join(lines) + "\n"


_CSV_COLUMNS = [f.name for f in fields(OpStats)][1:]  # every field but the name


def render_csv(summary: OpSummary, keys: dict[str, str]) -> str:
    """Every operator as CSV, one row each, with its metric key.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::mul", 1, 2.0, 2.0)], 1, 1, 1.0)
        >>> render_csv(s, {"aten::mul": "aten.mul"}).splitlines()[1]
        'aten::mul,aten.mul,1.0,2.0,2.0,100.0,,,,,'
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "key", *_CSV_COLUMNS])
    for op in summary.ops:
        values = (getattr(op, column) for column in _CSV_COLUMNS)
        writer.writerow([op.name, keys.get(op.name, ""), *("" if v is None else v for v in values)])
    return out.getvalue()


def render_side_by_side(summaries: dict[str, OpSummary]) -> str:
    """The seed's side-by-side table of variants: device time, self CPU time, op calls, wall.

    Args:
        summaries: variant name to its window summary, in display order.

    Returns:
        A Markdown table; device time shows ``n/a`` where none was measured.

    Example:
        >>> from neuron_mlflow.summary.ops import RawOp, build_summary
        >>> s = build_summary([RawOp("aten::_fused_rms_norm", 1, 47.6, 47.6, 403.3, 403.3)],
        ...                   1, 1, 500.0, device_label="NEURON")
        >>> print(render_side_by_side({"rms_norm": s}).splitlines()[2])
        | rms_norm | 403.3 | 47.6 | 1 | 500.0 |
    """
    lines = [
        "| variant | device time (us) | self CPU (us) | op calls | wall time (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant, s in summaries.items():
        device = f"{s.device_time_us:.1f}" if s.device_time_us is not None else "n/a"
        lines.append(
            f"| {variant} | {device} | {s.cpu_time_us:.1f} | {s.op_calls:g} "
            f"| {s.wall_time_us:.1f} |"
        )
    if not any(s.has_device_time for s in summaries.values()):
        lines += ["", "Device time was not measured (CPU backend)."]
    return "\n".join(lines) + "\n"
