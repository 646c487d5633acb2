"""The local GPU, once: its name, compute capability and fa4verify arch.

Every live check, the audit's arch selection, the labels "measured on <GPU> (sm_XY)" and the
production target read the device from :func:`local_gpu`. Tests fake a device by patching
``torch.cuda.is_available`` / ``get_device_name`` / ``get_device_capability`` and calling
:func:`local_gpu.cache_clear` (``tests/test_fake_device.py``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from fa4verify.kernels import facts

__all__ = ["GPU", "local_gpu", "where_measured", "where_recorded"]


@dataclass(frozen=True)
class GPU:
    """A CUDA device as fa4verify labels it."""

    name: str
    major: int
    minor: int

    @property
    def arch(self) -> Optional[str]:
        """"sm90" | "sm100" | "sm103", or None where FA4 runs no SM90/SM100 kernel."""
        return facts.arch_from_capability(self.major, self.minor)

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        return facts.capability_label(self.major, self.minor)

    @property
    def label(self) -> str:
        """``NVIDIA H200 (sm_90)``."""
        return f"{self.name} ({self.sm})"

    @property
    def family(self) -> str:
        """The GPU family a recording applies to: the name without vendor and memory suffixes
        (``NVIDIA H200`` -> ``H200``; ``NVIDIA B200`` -> ``B200``)."""
        n = self.name.replace("NVIDIA", "").strip()
        return n.split()[0] if n else self.name

    def unsupported_reason(self) -> str:
        return f"{self.label}: " + facts.unsupported_reason(self.major, self.minor)


@functools.lru_cache(maxsize=1)
def local_gpu() -> Optional[GPU]:
    """The first CUDA device, or None without CUDA (cached; ``local_gpu.cache_clear()``)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        name = str(torch.cuda.get_device_name(0))
        major, minor = torch.cuda.get_device_capability(0)
    except Exception:
        return None
    return GPU(name, int(major), int(minor))


def where_measured(gpu: GPU) -> str:
    return f"measured on {gpu.label}"


def where_recorded(gpu_name: str, sm: str) -> str:
    return f"recorded on {gpu_name} ({sm})"
