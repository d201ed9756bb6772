"""Documented peak numbers of Trainium chips, for MFU and the compute/memory verdict.

Source: AWS Neuron documentation, ``about-neuron/arch/neuron-hardware/`` and
``about-neuron/arch/neuron-features/logical-neuroncore-config.rst`` (SDK 2.32.0), summarised
in ``shared/neuron-tools.md`` section 3. Dense TFLOPS per chip; a NeuronCore's share is the
chip figure divided by its logical cores (physical cores / LNC), as the documentation derives
it. The per-core TensorEngine figures of the core pages do not multiply to the chip figure;
the chip figure is used.

Example:
    >>> peak = chip_peak("trn2.48xlarge")
    >>> peak.family, peak.bf16_tflops, round(peak.core_tflops(), 2)
    ('trn2', 667.0, 166.75)
    >>> chip_peak("p5.48xlarge") is None
    True
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChipPeak:
    """Peak numbers of one Trainium chip, as documented.

    Attributes:
        family: ``trn1``, ``trn2``, ``trn3``.
        bf16_tflops: dense BF16 TFLOPS per chip.
        physical_cores: NeuronCores per chip.
        default_lnc: physical cores per logical core by default.
    """

    family: str
    bf16_tflops: float
    physical_cores: int
    default_lnc: int

    def core_tflops(self, lnc: int | None = None) -> float:
        """Dense BF16 TFLOPS of one logical NeuronCore at ``lnc`` (default: the family's):
        the chip figure over its logical cores."""
        return self.bf16_tflops / max(self.physical_cores // (lnc or self.default_lnc), 1)


PEAKS: dict[str, ChipPeak] = {
    "trn1": ChipPeak("trn1", 190.0, 2, 1),  # 2 NC-v2 per chip, no LNC
    "trn2": ChipPeak("trn2", 667.0, 8, 2),  # 8 NC-v3 per chip, LNC 1 or 2 (default 2)
    "trn3": ChipPeak("trn3", 671.0, 8, 2),  # 8 NC-v4, LNC 1 or 2 (default undocumented: 2)
}
"""Documented peaks per chip, by instance family."""

_FAMILY = re.compile(r"^(trn\d)")
_DEVICE_TYPE = {"trainium": "trn1", "trainium1": "trn1", "trainium2": "trn2", "trainium3": "trn3"}
_DMI = Path("/sys/devices/virtual/dmi/id/product_name")


def chip_peak(name: str | None) -> ChipPeak | None:
    """The documented peaks of the chip of ``name``, if known: an instance type
    (``trn1n.32xlarge``) or a device type (``trainium2``).

    Example:
        >>> chip_peak("trn1n.32xlarge").family, chip_peak("trainium2").family
        ('trn1', 'trn2')
        >>> chip_peak("inf2.xlarge") is None
        True
    """
    text = (name or "").strip().lower()
    match = _FAMILY.match(text)
    return PEAKS.get(_DEVICE_TYPE.get(text) or (match[1] if match else ""))


def host_instance_type() -> str | None:
    """The EC2 instance type of this host from DMI, if readable (no network)."""
    try:
        text = _DMI.read_text().strip()
    except OSError:
        return None
    return text or None


def logical_core_config() -> int | None:
    """``NEURON_LOGICAL_NC_CONFIG`` (1 or 2) when set, else ``None`` (the family's default)."""
    value = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    return int(value) if value in {"1", "2"} else None
