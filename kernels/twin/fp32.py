"""fp32 arithmetic shared by the twin's forward and backward (``fa4verify.kernels.twin``).

Labelled "CPU twin" wherever a figure is computed with it.  Every function here is a public
building block of both passes (the backward used to import them as privates of the forward):

* rounding arithmetic ``mul`` / ``add`` / ``sub`` / ``fma`` -- "as FA4" ``*.rn.f32``: bit-exact
  through :mod:`fa4verify.oracles.binary32` when every operand is float32; on float64 operands
  (the output of an exact upstream stage, see the forward's stage switches) the fp64 result is
  rounded once to fp32 (``rn32``).  ``div`` is IEEE fp32 division RN.
* ``cast_to`` -- fp32 -> bf16 / fp16 / fp8 (RNE, fp8 e4m3 saturating), values held in float32.
* ``mma`` -- the tensor-core fp32 accumulation models (``ACCUMULATIONS``).
* ``infer_dtype`` / ``check_representable`` -- the input dtype (fa4verify's spelling, ``DTYPES``)
  and the check that inputs are values of it.

Units: every result is an fp32 value (float32 array), except ``mma(..., exact=True)`` (fp64).
"""
from __future__ import annotations

import math

import numpy as np

from fa4verify.kernels import facts as _facts
from fa4verify.oracles import binary32 as b32

__all__ = ["F32", "F64", "LOG2_E", "LN2", "DTYPES", "ACCUMULATIONS", "is32", "rn32", "mul", "add",
           "sub", "div", "fma", "cast_to", "mma", "infer_dtype", "check_representable"]

F32, F64 = np.float32, np.float64
LOG2_E = math.log2(math.e)
LN2 = math.log(2.0)

#: The input dtypes of the twin, in fa4verify's one spelling (``fp8`` is e4m3).
DTYPES: tuple[str, ...] = _facts.DTYPES
#: The models of tensor-core fp32 accumulation (see :func:`mma`).
ACCUMULATIONS: tuple[str, ...] = ("exact-then-round", "sequential", "pairwise", "sm90-tensor-core")


# =========================================================================== rounding arithmetic
def is32(*xs) -> bool:
    return all(np.asarray(x).dtype == F32 for x in xs)


def rn32(x64) -> np.ndarray:
    """Round fp64 values to fp32 (RNE; a single rounding of the fp64 value)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x64, dtype=F64).astype(F32)


def mul(a, b) -> np.ndarray:
    """As-FA4 ``mul.rn.f32``: exact on fp32 inputs; on fp64 (exact-upstream) inputs, RN32 of the
    fp64 product."""
    if is32(a, b):
        return b32.mul(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        return rn32(np.asarray(a, F64) * np.asarray(b, F64))


def add(a, b) -> np.ndarray:
    if is32(a, b):
        return b32.add(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        return rn32(np.asarray(a, F64) + np.asarray(b, F64))


def sub(a, b) -> np.ndarray:
    if is32(a, b):
        return b32.sub(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        return rn32(np.asarray(a, F64) - np.asarray(b, F64))


def div(a, b) -> np.ndarray:
    """IEEE fp32 division RN (fp64 quotient of fp32 operands rounded once is correctly rounded)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return rn32(np.asarray(a, F64) / np.asarray(b, F64))


def fma(a, b, c) -> np.ndarray:
    if is32(a, b, c):
        a, b, c = np.broadcast_arrays(a, b, c)
        return b32.fma(np.ascontiguousarray(a), np.ascontiguousarray(b), np.ascontiguousarray(c))
    with np.errstate(invalid="ignore", over="ignore"):
        return rn32(np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64))



# =========================================================================== casts and MMA models
def cast_to(x, dtype: str, *, rz: bool = False) -> np.ndarray:
    """fp32 -> ``dtype`` (RNE; ``rz=True`` rounds toward zero), returned as float32 values.
    fp8 e4m3 saturates (``cvt.rn.satfinite``)."""
    x = np.asarray(x)
    if x.dtype != F32:
        x = rn32(x)   # an exact-upstream value: cvt operates on fp32 registers
    if dtype == "bf16":
        r = b32.to_bf16(x)
    elif dtype == "fp16":
        r = b32.to_fp16(x)
    elif dtype == "fp8":
        r = b32.to_fp8_e4m3fn(x, satfinite=True)
    else:
        raise ValueError(f"unknown dtype {dtype!r}")
    if rz:
        over = np.isfinite(r) & (np.abs(r) > np.abs(x))
        if over.any():
            if dtype == "bf16":
                r = np.where(over, b32.from_bits(b32.bits(x) & 0xFFFF0000), r)
            elif dtype == "fp16":
                r16 = r.astype(np.float16)
                down = np.nextafter(r16, np.float16(0)).astype(F32)
                r = np.where(over, down, r)
            else:
                raise ValueError("p_cast_rz is modelled for bf16/fp16 only")
    return r.astype(F32)


# =========================================================================== matmul models
def mma(a, b, init, mode: str, exact: bool = False) -> np.ndarray:
    """``init + a @ b^T`` over the last axis of ``a`` (..., M, K) and ``b`` (..., N, K).

    ``exact=True`` returns the fp64 value (the stage switch).  ``init`` is None (zero-init MMA)
    or broadcastable to (..., M, N).  See module docstring for the ``mode`` models.
    """
    a64 = np.asarray(a, F64)
    b64 = np.asarray(b, F64)
    with np.errstate(invalid="ignore", over="ignore"):
        dot = np.matmul(a64, np.swapaxes(b64, -1, -2))
        if exact or mode == "exact-then-round":
            r = dot if init is None else dot + np.asarray(init, F64)
            return r if exact else rn32(r)
        K = a64.shape[-1]
        if mode == "sm90-tensor-core":
            # Note [SM90 MMA model] (kernels/twin/tensor_core.py): bit-exact for 16-bit inputs
            from fa4verify.kernels.twin import tensor_core as _tc
            return _tc.mma(a64, b64, init, _tc.SM90_16BIT)       # bf16 and fp16 alike
        if mode == "sequential":
            acc = None if init is None else np.asarray(init)
            for k in range(K):
                p = rn32(a64[..., :, k, None] * b64[..., None, :, k])
                if acc is None:
                    acc = p
                else:
                    acc = add(acc, p) if acc.dtype == F32 else rn32(acc + p.astype(F64))
            return acc.astype(F32)
        if mode == "pairwise":
            p = rn32(a64[..., :, None, :] * b64[..., None, :, :])
            n = p.shape[-1]
            while n > 1:
                if n % 2:
                    p = np.concatenate([p, np.zeros(p.shape[:-1] + (1,), F32)], axis=-1)
                    n += 1
                p = b32.add(p[..., 0::2], p[..., 1::2])
                n //= 2
            s = p[..., 0]
            return s if init is None else add(np.asarray(init).astype(F32, copy=False)
                                              if np.asarray(init).dtype == F32 else init, s)
    raise ValueError(f"accumulation={mode!r}: expected one of {ACCUMULATIONS}")


# =========================================================================== input dtypes
def infer_dtype(x) -> tuple[np.ndarray, str | None]:
    """(float32 array, dtype name or None) from a torch tensor or numpy array."""
    name = None
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        tmap = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        if hasattr(torch, "float8_e4m3fn"):
            tmap[torch.float8_e4m3fn] = "fp8"
        name = tmap.get(x.dtype)
        arr = x.detach().to("cpu").float().numpy()
        return np.ascontiguousarray(arr, dtype=F32), name
    a = np.asarray(x)
    dn = str(a.dtype)
    if dn == "bfloat16":
        name = "bf16"
    elif a.dtype == np.float16:
        name = "fp16"
    elif dn == "float8_e4m3fn":
        name = "fp8"
    return np.ascontiguousarray(a.astype(F32)), name


def check_representable(a: np.ndarray, dtype: str, what: str) -> None:
    r = cast_to(a, dtype)
    bad = ~((r == a) | (np.isnan(r) & np.isnan(a)))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}[{idx}] = {a[idx]!r} is not a {dtype} value; round the inputs "
                         f"to {dtype} first (binary32.round_to_format)")
