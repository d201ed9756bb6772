"""``python -m neuron_mlflow.cli``: the ``neuron-mlflow`` command line."""

import sys

from neuron_mlflow.cli.app import main

sys.exit(main())
