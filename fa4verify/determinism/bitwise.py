"""Bit-level helpers (torch; any device): raw bits, sign-magnitude order, bitwise comparison with
ULP distance, NaN counts and SHA-256 digests -- the primitives every determinism verdict rests on."""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

#: dtype name -> (integer view dtype name, exponent mask, mantissa mask, sign bit)
_FORMATS: dict[str, tuple[str, int, int, int]] = {
    "bfloat16": ("int16", 0x7F80, 0x007F, 0x8000),
    "float16": ("int16", 0x7C00, 0x03FF, 0x8000),
    "float32": ("int32", 0x7F800000, 0x007FFFFF, 0x80000000),
}

def _torch():
    import torch
    return torch


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _signed(value: int, nbits: int) -> int:
    return value - (1 << nbits) if value >= 1 << (nbits - 1) else value


def as_tensor(x):
    """A torch tensor sharing memory with ``x`` (torch tensor, or numpy array incl. ml_dtypes bf16)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x
    import numpy as np
    a = np.ascontiguousarray(x)
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def bits(t):
    """The raw bits of a bf16/fp16/fp32 tensor as a signed integer tensor of the same width."""
    t = as_tensor(t)
    name = _dtype_name(t)
    if name not in _FORMATS:
        raise TypeError(f"bits(): unsupported dtype {t.dtype} (bfloat16, float16, float32 only)")
    return t.contiguous().view(getattr(_torch(), _FORMATS[name][0]))


def is_nan_bits(b, dtype_name: str):
    """Elementwise NaN test on raw bits: exponent all ones and mantissa non-zero."""
    _, emask, mmask, _ = _FORMATS[dtype_name]
    nb = 16 if _FORMATS[dtype_name][0] == "int16" else 32
    e = _signed(emask, nb)
    return ((b & e) == e) & ((b & mmask) != 0)


def ordered(b, dtype_name: str):
    """Sign-magnitude bits -> int64 whose order is the float order (+0 and -0 both map to 0)."""
    nb = 16 if _FORMATS[dtype_name][0] == "int16" else 32
    x = b.to(_torch().int64) & ((1 << nb) - 1)
    sign = x >> (nb - 1)
    mag = x & ((1 << (nb - 1)) - 1)
    return _torch().where(sign == 1, -mag, mag)


@dataclass(frozen=True)
class BitDiff:
    """Bitwise comparison of two tensors of the same dtype and shape.

    ``differing`` counts elements whose bits differ (so +0 vs -0 counts, two NaNs with the same
    payload do not). ``max_ulp`` is the largest ``|ordered(a) - ordered(b)|`` over elements where
    neither side is NaN, in ULPs of the tensor's dtype; ``nan_mismatch`` counts elements that are
    NaN on exactly one side. ``first_index`` is the flat index of the first differing element.
    """
    numel: int
    differing: int
    max_ulp: int
    nan_mismatch: int
    first_index: int | None

    @property
    def equal(self) -> bool:
        return self.differing == 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compare_bitwise(a, b) -> BitDiff:
    """Compare ``a`` (actual) with ``b`` (reference) bit for bit; see :class:`BitDiff`."""
    ta, tb = as_tensor(a), as_tensor(b)
    if ta.shape != tb.shape or ta.dtype != tb.dtype:
        raise ValueError(f"compare_bitwise: shape/dtype differ: {tuple(ta.shape)} {ta.dtype} vs "
                         f"{tuple(tb.shape)} {tb.dtype}")
    name = _dtype_name(ta)
    ba, bb = bits(ta).reshape(-1), bits(tb).to(ta.device).reshape(-1)
    neq = ba != bb
    differing = int(neq.sum())
    if differing == 0:
        return BitDiff(ba.numel(), 0, 0, 0, None)
    na, nb_ = is_nan_bits(ba, name), is_nan_bits(bb, name)
    both = ~(na | nb_)
    d = (ordered(ba, name) - ordered(bb, name)).abs()
    d = d[both & neq]
    max_ulp = int(d.max()) if d.numel() else 0
    first = int(neq.nonzero()[0, 0])
    return BitDiff(ba.numel(), differing, max_ulp, int((na ^ nb_).sum()), first)


def nan_count(t) -> int:
    """Number of NaN elements (from the bits; works for bf16/fp16/fp32)."""
    t = as_tensor(t)
    return int(is_nan_bits(bits(t), _dtype_name(t)).sum())


def digest(x) -> str:
    """SHA-256 (hex) of the raw bytes of a tensor or array, in C order. Shape and dtype are not
    hashed (record them beside the digest)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        t = x.detach().contiguous().reshape(-1)
        if t.device.type != "cpu":
            t = t.cpu()
        data = t.view(torch.uint8).numpy().tobytes()
    else:
        import numpy as np
        data = np.ascontiguousarray(x).tobytes()
    return hashlib.sha256(data).hexdigest()
