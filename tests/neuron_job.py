"""Profile the seed's naive RMSNorm with backend='neuron' against the torch_neuronx double.

Run by the Neuron tests in its own process (the double renames PrivateUse1 to 'neuron'
process-wide). Usage::

    python tests/neuron_job.py LOCAL_DIR [--cores 0,1] [--between] [--style decorator|context]
        [--neuron KEY=JSON ...]

``--between`` runs unprofiled work (``torch.ones(8) * 3``) between the profiled calls, which
the double also gives device time; ``--style context`` profiles with ``nm.Profiler`` steps
instead of a decorated function. Prints ``RUN_ID=...``, ``OPTIONS=...`` (the keyword
arguments NeuronConfig received) and ``SYNCS=...``.
"""

from __future__ import annotations

import argparse
import json

import torch

import neuron_mlflow as nm
from tests.helpers import inputs, rmsnorm_naive


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("local_dir")
    parser.add_argument("--cores")
    parser.add_argument("--between", action="store_true")
    parser.add_argument("--style", default="decorator", choices=["decorator", "context"])
    parser.add_argument("--neuron", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    neuron: dict[str, object] = {"capture_enabled_for_nc": args.cores} if args.cores else {}
    for item in args.neuron:
        key, _, value = item.partition("=")
        neuron[key] = json.loads(value)
    options = {
        "backend": "neuron",
        "schedule": nm.Schedule(warmup=1, active=2),
        "local_dir": args.local_dir,
        "experiment_name": "neuron-double",
        "neuron": neuron,
        "top_k": 100,
        "strict": True,
    }
    x, w = inputs()
    if args.style == "decorator":
        profiled = nm.profile(**options)(rmsnorm_naive)
        for _ in range(3):
            profiled(x, w)
            if args.between:
                _ = torch.ones(8) * 3
        profiler = profiled.profiler
    else:
        with nm.Profiler(**options) as profiler:
            for _ in range(3):
                rmsnorm_naive(x, w)
                profiler.step()
    profiler.close()
    session = profiler.session
    options_seen = session.backend._exporter.config.options
    print(f"RUN_ID={profiler.run_id}")
    print("OPTIONS=" + json.dumps(sorted(options_seen)))
    print(f"SYNCS={torch.neuron.synchronize_calls}")


if __name__ == "__main__":
    main()
