"""The package surface: __all__, a light import, and the README's examples."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_mlflow

ROOT = Path(__file__).resolve().parents[1]


def test_all_lists_exactly_the_public_names() -> None:
    for name in neuron_mlflow.__all__:  # each loads on first use
        assert getattr(neuron_mlflow, name) is not None
    public = {
        name
        for name in vars(neuron_mlflow)
        if not name.startswith("_")
        and not isinstance(getattr(neuron_mlflow, name), type(sys))  # submodules
    }
    assert set(neuron_mlflow.__all__) == public
    assert set(dir(neuron_mlflow)) >= public
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        neuron_mlflow.Nope  # noqa: B018


def test_import_is_light() -> None:
    code = (
        "import sys, neuron_mlflow; "
        "heavy = [m for m in ('torch', 'mlflow', 'lightning') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_readme_python_examples_run(tmp_path, monkeypatch) -> None:
    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    for block in blocks:
        if "# not run in tests" in block:
            continue
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)


def test_readme_documents_every_config_field() -> None:
    readme = (ROOT / "README.md").read_text()
    fields = [name for name in neuron_mlflow.ProfilerConfig.model_fields if name != "schedule"]
    fields = [name for name in fields if name != "neuron"]
    fields += [f"schedule.{name}" for name in neuron_mlflow.Schedule.model_fields]
    fields += [f"neuron.{name}" for name in neuron_mlflow.NeuronOptions.model_fields]
    missing = [name for name in fields if f"| `{name}` |" not in readme]
    assert missing == []


def test_readme_documents_every_core_metric() -> None:
    from neuron_mlflow.naming import window_metrics
    from neuron_mlflow.summary.ops import RawOp, build_summary

    summary = build_summary([RawOp("aten::mm", 1, 1.0, 1.0, 2.0, 2.0)], 1, 1, 3.0, "CUDA")
    readme = (ROOT / "README.md").read_text()
    for key in window_metrics(summary, "P", top_k=1):
        documented = key.replace("aten.mm", "<key>")
        assert f"| `{documented}` |" in readme, documented
