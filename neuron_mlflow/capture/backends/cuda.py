"""The CUDA backend (also ROCm builds of torch): CPU operators plus GPU kernels.

Example:
    >>> CudaBackend.name, CudaBackend.device_label
    ('cuda', 'CUDA')
"""

from __future__ import annotations

from typing import ClassVar

from neuron_mlflow.capture.backends.base import BaseBackend


class CudaBackend(BaseBackend):
    """Profile CPU operators and CUDA kernels; needs a visible CUDA device.

    Example:
        >>> import torch
        >>> (CudaBackend.unavailable_reason() is None) == torch.cuda.is_available()
        True
    """

    name: ClassVar[str] = "cuda"
    device_label: ClassVar[str | None] = "CUDA"
    device_activity: ClassVar[str | None] = "CUDA"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import torch

        if not torch.backends.cuda.is_built():
            return (
                f"backend='cuda' needs a CUDA build of torch; this torch ({torch.__version__}) "
                "was built without CUDA. Install a CUDA build of torch, or use backend='cpu'"
            )
        if not torch.cuda.is_available():
            return (
                "backend='cuda' needs a visible CUDA device; torch.cuda.is_available() is False "
                "(check CUDA_VISIBLE_DEVICES and the driver), or use backend='cpu'"
            )
        return None

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def describe(self) -> dict[str, str]:
        import torch

        return {
            "backend": self.name,
            "device": torch.cuda.get_device_name(),
            "cuda_version": str(torch.version.cuda or torch.version.hip),
        }
