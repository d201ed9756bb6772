"""The package surface: __all__, a light import, and the reference in docs/.

The code blocks of README.md and docs/ run in tests/test_docs_code_blocks.py.
"""

from __future__ import annotations

import pkgutil
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


# `nm.<name>` / `neuron_mlflow.<Name>` / `neuron_mlflow.<name>(` and `from neuron_mlflow import`
_REFERENCE = re.compile(r"\b(nm|neuron_mlflow)\.([A-Za-z]\w*)(\s*\()?")
_FROM_IMPORT = re.compile(r"^\s*from neuron_mlflow import (?:\(([^)]*)\)|([^\n#]+))", flags=re.M)


def _names_in(text: str) -> set[str]:
    """Public names a Markdown text uses; submodules and tag keys (``neuron_mlflow.rank``) aside."""
    submodules = {m.name for m in pkgutil.iter_modules(neuron_mlflow.__path__)}
    names = set()
    for alias, name, call in _REFERENCE.findall(text):
        if name not in submodules and (alias == "nm" or name[0].isupper() or call):
            names.add(name)
    for parenthesized, line in _FROM_IMPORT.findall(text):
        names.update(n.strip() for n in (parenthesized or line).split(",") if n.strip())
    return names


def _documented_names() -> set[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return set().union(*(_names_in(path.read_text()) for path in texts))


def test_names_in_markdown() -> None:
    text = "`nm.Foo`, `@nm.bar`, neuron_mlflow.Baz, `neuron_mlflow.rank` tag, neuron_mlflow.trace"
    text += "\nfrom neuron_mlflow import Qux, quux\nneuron_mlflow.call(1)"
    assert _names_in(text) == {"Foo", "bar", "Baz", "Qux", "quux", "call"}


def test_all_is_what_the_readme_and_docs_use() -> None:
    documented = _documented_names()
    exported = set(neuron_mlflow.__all__)
    assert sorted(documented - exported) == [], "used in README/docs but not exported"
    assert sorted(exported - documented) == [], "exported but used nowhere in README/docs"
    # each one imports, from a fresh interpreter (the names load lazily)
    code = f"from neuron_mlflow import {', '.join(sorted(documented))}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_import_is_light() -> None:
    code = (
        "import sys, neuron_mlflow; "
        "heavy = [m for m in ('torch', 'mlflow', 'lightning') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_docs_document_every_config_field() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    fields = [name for name in neuron_mlflow.ProfilerConfig.model_fields if name != "schedule"]
    fields = [name for name in fields if name != "neuron"]
    fields += [f"schedule.{name}" for name in neuron_mlflow.Schedule.model_fields]
    fields += [f"neuron.{name}" for name in neuron_mlflow.NeuronOptions.model_fields]
    missing = [name for name in fields if f"| `{name}` |" not in reference]
    assert missing == []


def test_docs_document_every_core_metric() -> None:
    from neuron_mlflow.naming import window_metrics
    from neuron_mlflow.summary.ops import RawOp, build_summary

    summary = build_summary([RawOp("aten::mm", 1, 1.0, 1.0, 2.0, 2.0)], 1, 1, 3.0, "CUDA")
    reference = (ROOT / "docs" / "metrics.md").read_text()
    for key in window_metrics(summary, "P", top_k=1):
        documented = key.replace("aten.mm", "<key>")
        assert f"| `{documented}` |" in reference, documented


def test_the_cli_says_its_version(capsys) -> None:
    from importlib import metadata

    from neuron_mlflow.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"neuron-mlflow {metadata.version('neuron-mlflow')}"
