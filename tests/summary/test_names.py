"""Readable names: long demangled kernel names are folded; short names stay as they are."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from neuron_mlflow.summary.names import MAX_CHARS, SLACK_CHARS, display_names, short_name
from neuron_mlflow.summary.ops import RawOp, build_summary
from neuron_mlflow.summary.tables import render_csv, render_markdown

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _real_names() -> list[str]:
    names: set[str] = set()
    for path in TRACES.glob("*.json.gz"):
        with gzip.open(path, "rt") as handle:
            names.update(e.get("name", "") for e in json.load(handle)["traceEvents"])
    return sorted(names)


def test_the_issue_example_kernel_folds_to_its_family_name() -> None:
    (name,) = [
        n
        for n in _real_names()
        if n.startswith("void split_embedding_backward_codegen_")
        and "weighted_kernel_cta_per_row_1<" in n
        and "unweighted" not in n
    ]
    assert len(name) > 1500
    assert short_name(name) == "split_embedding_backward_codegen_rowwise_adagrad_...<...>"


def test_short_names_unchanged_and_every_real_name_fits() -> None:
    names = _real_names()
    assert short_name("aten::mul") == "aten::mul"
    assert short_name("Torch-Compiled Region: 0/0") == "Torch-Compiled Region: 0/0"
    shown = display_names(names)
    assert all(len(s) <= MAX_CHARS + SLACK_CHARS + 6 for s in shown.values())
    assert len(set(shown.values())) == len(names)  # distinct on screen
    cutlass = [shown[n] for n in names if "cutlass::Kernel<" in n]
    assert cutlass and all(s.startswith("cutlass::Kernel<cutlass_80_tensorop_") for s in cutlass)


def test_not_cxx_long_name_keeps_start_and_end() -> None:
    name = "<class '" + "a." * 60 + "Gather'>"
    short = short_name(name)
    assert short.startswith("<class 'a.a.") and short.endswith("Gather'>") and "..." in short


def test_summary_md_shows_short_names_and_csv_keeps_full_names() -> None:
    long = "void vectorized_elementwise_kernel<4, " + "at::native::BinaryFunctor<float>, " * 30
    long += "float>(int, float*)"
    s = build_summary([RawOp(long, 1, 5.0, 5.0, 9.0, 9.0)], 1, 1, 20.0, device_label="CUDA")
    markdown = render_markdown(s)
    assert long not in markdown and "vectorized_elementwise_kernel<4, at::native::" in markdown
    assert long in render_csv(s, {long: "k"})
    assert long in json.dumps(s.to_dict())


def test_cxx_function_without_templates_loses_its_argument_list() -> None:
    name = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    assert short_name(name) == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
