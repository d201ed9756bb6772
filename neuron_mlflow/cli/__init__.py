"""The ``neuron-mlflow`` command line (console script ``neuron_mlflow.cli:main``).

Example:
    >>> main(["frobnicate"])
    2
"""

from neuron_mlflow.cli.app import main

__all__ = ["main"]
