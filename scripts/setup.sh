#!/usr/bin/env bash
# Create ./.venv and install neuron-mlflow with its development tools.
#
# Where no torch is importable in the venv yet, the CPU build is installed first
# (torch==2.13.0), so that the package's own range requirement (torch>=2.4) does not
# pull a multi-GB CUDA build. A venv that already has torch (e.g. a Trainium host's
# Neuron-matched build) keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
