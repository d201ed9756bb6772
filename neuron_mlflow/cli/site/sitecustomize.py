"""``neuron-mlflow run``: autolog in every Python process the command starts (docs/autolog.md).

``site`` imports this module in every interpreter of the command; it runs the
``sitecustomize`` it shadows, then ``autolog_from_environment``; a failure is one line on
stderr and the program runs unprofiled.
"""

import os
import sys


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, as ``site`` would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py reports a failing sitecustomize, and goes on
        sys.stderr.write(
            f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{type(exc).__name__}: {exc}\n"
        )


def _autolog() -> None:
    try:
        from neuron_mlflow.integrations.autolog import autolog_from_environment

        autolog_from_environment()
    except Exception as exc:
        sys.stderr.write(
            f"neuron-mlflow run: profiling is off in this process "
            f"({type(exc).__name__}: {exc}); the program runs unprofiled\n"
        )


# Only as ``site`` imports it in a process of ``neuron-mlflow run`` (the variable set): a tool
# that imports the file (pytest's doctest collection) runs nothing.
if __name__ == "sitecustomize" and "NEURON_MLFLOW_AUTOLOG" in os.environ:
    _chain()
    if os.environ["NEURON_MLFLOW_AUTOLOG"] == "1":
        _autolog()
