"""The values of a problem: q, k, v, dout and learnable sinks as exact bf16/fp16 values.

A problem holds only a :class:`ValueSpec` (a distribution name, a few parameters and a seed);
the arrays are generated with numpy from the seed (:func:`generate_values`). So a problem stays
small, and a Hypothesis example (``fa4verify._strategies.values.value_specs`` draws the spec)
shrinks toward ``distribution="normal"``, seed 0 and the first listed parameter value, never
through megabytes of array data.

Every generated value is exactly representable in the problem dtype: fp32 draws are rounded
with :func:`fa4verify.oracles.binary32.to_bf16`, :func:`~fa4verify.oracles.binary32.to_fp16` or
:func:`~fa4verify.oracles.binary32.to_fp8_e4m3fn` (RNE) and returned widened to float32. The
distributions never produce NaN or infinity; magnitudes are kept below :data:`INPUT_LIMIT` (fp16:
2^14, fp16 max is 65504; fp8 e4m3fn: 448, its largest finite value) so that the inputs themselves
never overflow.

FP8 descales (``AttentionProblem.descales``): :func:`generate_descales` draws one fp32 factor per
(batch entry, KV head) for each named input, log-uniform in [2^-2, 2^2] with a full 24-bit
significand (so FA4's fp32 products of them round), from a generator of its own (the other
arrays' draws do not move).

Distributions (``ValueSpec.distribution``), ``n`` = standard normal:

* ``"normal"``: ``sigma * n`` (sigma in {1, 0.5, 2, 4}).
* ``"outliers"``: ``n + N(0, 100^2) * Bernoulli(p)`` on q, k and v (standard deviation 100;
  p in {0.001, 0.01, 0.05}).
* ``"negative_scores"``: q = n + a*u, k = n - a*u for a random unit vector u, so every scaled
  score is about ``-shift`` (shift in [10, 5000] nats); LSE < -88.7 = ln(FLT_MIN) for large
  shifts (cuDNN-frontend #744, PyTorch #196678).
* ``"peaked_rescale"``: q = sigma*n + u, k_j = sigma*n - beta(j)*u with beta growing by a step per
  KV tile of ``tile_n`` keys: the scores fall from left to right, and as FA4's forward walks a
  row's KV tiles from the last one down (both archs: ``n_block = n_block_max - 1 - n_tile``), the
  row's running max grows by ``delta`` log2 units at every tile boundary it crosses, so every one
  rescales O (SM90) or meets the lazy rescale's threshold (SM100); delta is drawn around FA4's
  SM100 ``rescale_threshold`` (8.0), e.g. 7.9, 8.0, 8.1.
* ``"huge"``: q, k scaled by ``2^e_qk`` and v by ``2^e_v`` (bf16: e_qk <= 10, e_v <= 20; fp16:
  e_qk <= 6, e_v <= 10): one-hot softmax rows and large outputs.
* ``"tiny"``: everything scaled by ``2^-e`` (bf16: e <= 30; fp16: e <= 16, subnormal fp16 inputs).
* ``"edges"``: standard normal, then the keys just inside and just outside every mask edge of the
  tile-boundary query rows score ``score`` nats (default 6) above the rest
  (:mod:`fa4verify.problem.edges`, Note [Edge values]; applied by
  ``AttentionProblem.materialize``, which knows the keep-mask).

Learnable sinks (when the problem has them): ``sink_shift + sink_scale * n`` per head, rounded to
bf16 (FA4 accepts fp32 sinks; bf16-exact values keep the problem exact in every sink dtype);
``sink_off_head`` (a head index) sets that head's sink to -inf, FA4's own "no sink" (Note [A sink
of -inf] in ``oracles/semantics.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fa4verify.oracles import binary32

#: Distribution names, in shrink order.
DISTRIBUTIONS: tuple[str, ...] = ("normal", "outliers", "negative_scores", "peaked_rescale", "huge", "tiny",
                                   "edges")


@dataclass(frozen=True)
class ValueSpec:
    """What :func:`generate_values` needs: a distribution, its parameters, a seed.

    ``params`` is a sorted tuple of ``(name, value)`` pairs (hashable, JSON-able via
    :meth:`to_dict`); see the module docstring for each distribution's parameters.
    """

    distribution: str = "normal"
    seed: int = 0
    params: tuple[tuple[str, float], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"ValueSpec.distribution={self.distribution!r} not in {DISTRIBUTIONS}")
        object.__setattr__(self, "params", tuple(sorted((str(k), float(v)) for k, v in self.params)))

    def param(self, name: str, default: float) -> float:
        return dict(self.params).get(name, default)

    def to_dict(self) -> dict:
        return {"distribution": self.distribution, "seed": self.seed, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, d: dict) -> "ValueSpec":
        return cls(d["distribution"], int(d["seed"]), tuple(d.get("params", {}).items()))


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """RNE of float32 ``x`` to ``dtype`` ("bf16", "fp16" or "fp8": e4m3fn, saturating to +-448 as
    FA4's own casts do), returned as float32 (exact)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return binary32.to_bf16(x).reshape(x.shape)
    if dtype == "fp16":
        return binary32.to_fp16(x).reshape(x.shape)
    if dtype == "fp8":
        return binary32.to_fp8_e4m3fn(x).reshape(x.shape)
    raise ValueError(f"dtype={dtype!r} must be 'bf16', 'fp16' or 'fp8'")


#: the largest input magnitude a dtype's generated values keep (fp16: below 2^14 so sums of a few
#: inputs stay finite; fp8 e4m3fn: its largest finite value)
INPUT_LIMIT = {"bf16": 1e30, "fp16": 16384.0, "fp8": 448.0}



DESCALE_INPUTS: tuple[str, ...] = ("q", "k", "v")


def generate_descales(seed: int, batch: int, nheads_kv: int, which) -> dict[str, Optional[np.ndarray]]:
    """``{"q_descale", "k_descale", "v_descale"}``: float32 (batch, nheads_kv) factors for the
    inputs named in ``which`` (a subset of :data:`DESCALE_INPUTS`), None for the others."""
    rng = np.random.default_rng([int(seed), 0xDE5CA1E])
    out: dict[str, Optional[np.ndarray]] = {}
    for name in DESCALE_INPUTS:
        f = np.exp2(rng.uniform(-2.0, 2.0, (batch, nheads_kv))).astype(np.float32)   # drawn always
        out[f"{name}_descale"] = f if name in which else None
    return out


def _unit(rng: np.random.Generator, d: int) -> np.ndarray:
    u = rng.standard_normal(d)
    return u / max(np.linalg.norm(u), 1e-30)


def generate_values(spec: ValueSpec, *, dtype: str, q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                    v_shape: tuple[int, ...], key_positions: np.ndarray, softmax_scale: float,
                    nheads: int, with_sink: bool) -> dict[str, Optional[np.ndarray]]:
    """Arrays ``q, k, v, dout, learnable_sink`` (float32, exact in ``dtype``; sink bf16-exact).

    ``key_positions`` gives each key's position within its own sequence along the sequence axis of
    ``k_shape`` (axis ``-3``); only ``peaked_rescale`` uses it. ``dout`` has the output shape
    (``q_shape`` with v's head dim). Deterministic in ``spec``; the draw order is fixed.
    """
    rng = np.random.default_rng(spec.seed)
    d = q_shape[-1]
    o_shape = tuple(q_shape[:-1]) + (v_shape[-1],)
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(k_shape)
    v = rng.standard_normal(v_shape)
    dout = rng.standard_normal(o_shape)
    dist = spec.distribution
    if dist == "normal":
        s = spec.param("sigma", 1.0)
        q, k, v = q * s, k * s, v * s
    elif dist == "outliers":
        p, std = spec.param("p", 0.001), spec.param("outlier_std", 100.0)
        q = q + std * rng.standard_normal(q_shape) * (rng.random(q_shape) < p)
        k = k + std * rng.standard_normal(k_shape) * (rng.random(k_shape) < p)
        v = v + std * rng.standard_normal(v_shape) * (rng.random(v_shape) < p)
    elif dist == "negative_scores":
        a = math.sqrt(spec.param("shift", 100.0) / softmax_scale)
        u = _unit(rng, d)
        q = q + a * u
        k = k - a * u
    elif dist == "peaked_rescale":
        sigma, delta, tile = spec.param("sigma", 0.1), spec.param("delta", 8.0), spec.param("tile_n", 128.0)
        u = _unit(rng, d)
        step = delta / (softmax_scale * math.log2(math.e))   # growth of q.k per tile, before scaling
        tiles = (np.asarray(key_positions) // int(tile)).astype(np.float64)
        if tiles.shape != (k_shape[-3],):
            raise ValueError(f"key_positions shape {tiles.shape} != ({k_shape[-3]},)")
        q = sigma * q + u
        k = sigma * k - (step * tiles)[:, None, None] * u[None, None, :]
    elif dist == "huge":
        q, k = q * 2.0 ** spec.param("e_qk", 4), k * 2.0 ** spec.param("e_qk", 4)
        v = v * 2.0 ** spec.param("e_v", 0)
    elif dist == "tiny":
        s = 2.0 ** -spec.param("e", 8)
        q, k, v = q * s, k * s, v * s
    sink = None
    z = rng.standard_normal(nheads)   # drawn unconditionally so the draw order does not depend on it
    if with_sink:
        sink = binary32.to_bf16(np.float32(spec.param("sink_shift", 0.0) + spec.param("sink_scale", 1.0) * z)
                                ).reshape(nheads)
        off = spec.param("sink_off_head", -1.0)
        if off >= 0:
            if off != int(off) or off >= nheads:
                raise ValueError(f"ValueSpec sink_off_head={off:g}: expected a head index below {nheads}")
            sink[int(off)] = -np.inf
    lim = INPUT_LIMIT[dtype]
    out = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        out[name] = round_to_dtype(np.clip(arr, -lim, lim).astype(np.float32), dtype)
    out["learnable_sink"] = sink
    return out
