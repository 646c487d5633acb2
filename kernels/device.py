"""The local GPU, once: its name, compute capability and fa4verify arch.

Every live check, the audit's arch selection, the labels "measured on <GPU> (sm_XY)" and the
production target read the device from :func:`local_gpu`. Tests fake a device by patching
``torch.cuda.is_available`` / ``get_device_name`` / ``get_device_capability`` and calling
:func:`local_gpu.cache_clear` (``tests/test_fake_device.py``).

Note [Fake device]: with ``FA4VERIFY_FAKE_DEVICE`` set to a key of :data:`FAKE_DEVICES` (what
``fa4verify audit --fake-device KEY`` sets for itself and its workers) :func:`local_gpu` is that
GPU with ``fake=True``, on any machine: FA4 compiles for it under torch's FakeTensorMode and
launches nothing, so every figure is labelled "compile-only" (:func:`where_measured`), never
"measured on".
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

from fa4verify.kernels import facts

__all__ = ["GPU", "local_gpu", "where_measured", "where_recorded", "FAKE_DEVICE_ENV", "FAKE_DEVICES",
           "fake_device"]

#: Note [Fake device]: the variable that makes :func:`local_gpu` a GPU FA4 only compiles for
FAKE_DEVICE_ENV = "FA4VERIFY_FAKE_DEVICE"


@dataclass(frozen=True)
class GPU:
    """A CUDA device as fa4verify labels it."""

    name: str
    major: int
    minor: int
    #: Note [Fake device]: FA4 compiles for it, nothing runs
    fake: bool = False

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


#: Note [Fake device]: the GPUs ``--fake-device`` can stand for (the names their drivers report)
FAKE_DEVICES: dict[str, GPU] = {
    "b200": GPU("NVIDIA B200", 10, 0, fake=True),
    "b300": GPU("NVIDIA B300 SXM6 AC", 10, 3, fake=True),
    "h200": GPU("NVIDIA H200", 9, 0, fake=True),
}


def fake_device() -> Optional[str]:
    """The key of :data:`FAKE_DEVICES` this process stands for (Note [Fake device]), or None.
    An unknown key is a ValueError naming the known ones (never a silent real-GPU run)."""
    key = os.environ.get(FAKE_DEVICE_ENV, "").strip().lower()
    if not key:
        return None
    if key not in FAKE_DEVICES:
        raise ValueError(f"{FAKE_DEVICE_ENV}={key!r}: expected one of {', '.join(FAKE_DEVICES)}")
    return key


@functools.lru_cache(maxsize=1)
def local_gpu() -> Optional[GPU]:
    """The first CUDA device, or None without CUDA (cached; ``local_gpu.cache_clear()``); the
    fake one under Note [Fake device]."""
    key = fake_device()
    if key is not None:
        return FAKE_DEVICES[key]
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
    """Where a figure from ``gpu`` came from: "compile-only" on a fake one (Note [Fake device])."""
    return "compile-only" if gpu.fake else f"measured on {gpu.label}"


def where_recorded(gpu_name: str, sm: str) -> str:
    return f"recorded on {gpu_name} ({sm})"
