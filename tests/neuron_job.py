"""Profile the seed's naive RMSNorm with backend='neuron' against the torch_neuronx double.

Run by test_neuron_backend.py in its own process (the double renames PrivateUse1 to 'neuron'
process-wide). Usage: python tests/neuron_job.py LOCAL_DIR [CORES]; prints RUN_ID=... and
OPTIONS=... (the keyword arguments NeuronConfig received).
"""

from __future__ import annotations

import json
import sys

import torch

import neuron_mlflow as nm
from tests.helpers import inputs, rmsnorm_naive


def main(local_dir: str, cores: str | None = None) -> None:
    neuron = {"capture_enabled_for_nc": cores} if cores else {}
    profiled = nm.profile(
        backend="neuron",
        schedule=nm.Schedule(warmup=1, active=2),
        local_dir=local_dir,
        experiment_name="neuron-double",
        neuron=neuron,
        top_k=100,
        strict=True,
    )(rmsnorm_naive)
    x, w = inputs()
    for _ in range(3):
        profiled(x, w)
    options = profiled.profiler.session.backend._exporter.config.options
    print(f"RUN_ID={profiled.profiler.run_id}")
    print("OPTIONS=" + json.dumps(sorted(options)))
    print(f"SYNCS={torch.neuron.synchronize_calls}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
