"""Test double of AWS Neuron's torch_neuronx (see tests/neuron_double/README.md)."""

import sys
import types

import torch

__version__ = "2.13.0.double"

torch.utils.rename_privateuse1_backend("neuron")

_neuron = types.ModuleType("torch.neuron")
_neuron.synchronize_calls = 0


def _synchronize() -> None:
    _neuron.synchronize_calls += 1


_neuron.synchronize = _synchronize
_neuron.is_available = lambda: True
_neuron.device_count = lambda: 2
torch.neuron = _neuron
sys.modules["torch.neuron"] = _neuron
