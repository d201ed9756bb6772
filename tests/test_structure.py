"""The structure checks CI runs with the tests: import layers, types, lint.

There is no module-size limit: a module holds one concept, however long that is.

Each tool runs as a subprocess from the venv's ``bin`` (the README's test command runs them
this way in CI, through ``.ci/run``); a test fails with the tool's own report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PACKAGE = ROOT / "neuron_mlflow"
ROOT_MODULES = {"__init__.py", "errors.py", "naming.py", "schedule.py"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    tool = BIN / args[0]
    if not tool.exists():
        pytest.fail(f"{tool} is missing: install the dev extras (bash scripts/setup.sh)")
    return subprocess.run(
        [str(tool), *args[1:]], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_imports_point_one_way() -> None:
    result = _run("lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_mypy_passes() -> None:
    result = _run("mypy", "neuron_mlflow")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_ruff_check_passes() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_ruff_format_leaves_the_tree_as_it_is() -> None:
    result = _run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_package_root_holds_only_the_api_config_errors_naming_and_schedule() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules == ROOT_MODULES
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == {
        "config",  # the configuration models and their readable validation errors
        "capture",
        "trace",
        "summary",
        "sinks",
        "engine",
        "integrations",
        "cli",
    }
