"""One error tree: every exception class neuron-mlflow defines derives from NeuronMlflowError.

A user catches ``nm.NeuronMlflowError`` to catch whatever we raise; a warning of ours is a
``NeuronMlflowWarning`` (``neuron_mlflow.errors`` draws both trees).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import neuron_mlflow
from neuron_mlflow.errors import NeuronMlflowError, NeuronMlflowWarning

NEURON = "neuron_mlflow.capture.backends.neuron"
"""The one module that imports ``torch_neuronx`` (lazily: it imports without it, too)."""

ENTRY_POINTS = {"neuron_mlflow.cli.__main__"}
"""Importing it runs the command line (``sys.exit(main())``): read, not imported."""

_EXCEPTIONS = {
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}  # fmt: skip


def _modules() -> list[pkgutil.ModuleInfo]:
    return list(pkgutil.walk_packages(neuron_mlflow.__path__, prefix="neuron_mlflow."))


def test_every_exception_class_of_every_module_is_in_the_tree() -> None:
    imported, outside = [], []
    for info in _modules():
        if info.name in ENTRY_POINTS:
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            if info.name == NEURON:  # (a host without torch_neuronx, were it imported eagerly)
                continue
            raise
        imported.append(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, BaseException):
                continue
            tree = NeuronMlflowWarning if issubclass(cls, Warning) else NeuronMlflowError
            if not issubclass(cls, tree):
                outside.append(f"{info.name}.{name} ({cls.__mro__[1].__name__})")
    assert outside == [], f"exception classes outside the tree: {outside}"
    # the walk reached every layer, the Lightning front end and the capture requests included
    for name in (
        "neuron_mlflow.errors",
        "neuron_mlflow.engine.capture_requests",
        "neuron_mlflow.integrations.lightning",
        "neuron_mlflow.trace.reader",
        "neuron_mlflow.cli.app",
    ):
        assert name in imported
    assert len(imported) >= 80, len(imported)


def test_no_exception_class_is_defined_out_of_reach_of_the_import_check() -> None:
    """Classes inside functions or classes, and those of the modules not imported above, are
    read from the source: none derives from a builtin exception alone."""
    found = []
    for info in _modules():
        spec = importlib.util.find_spec(info.name)
        assert spec is not None and spec.origin is not None
        source = Path(spec.origin).read_text(encoding="utf-8")
        tree = ast.parse(source)
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            if id(node) in top_level and info.name not in ENTRY_POINTS:
                continue  # checked on the class itself, above
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            if any(b in _EXCEPTIONS for b in bases):
                found.append(f"{info.name}: class {node.name}({', '.join(bases)})")
    assert found == []


def test_the_capture_request_error_is_in_the_tree() -> None:
    from neuron_mlflow.engine.capture_requests import BadRequest, parse_request

    try:
        parse_request('{"steps": 0}', "tag", max_steps=50)
    except NeuronMlflowError as err:  # what a user catches
        assert isinstance(err, BadRequest) and isinstance(err, ValueError)
        assert "steps=0 is below 1" in str(err)
    else:  # pragma: no cover
        raise AssertionError("a bad request was read")
