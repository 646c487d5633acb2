"""Bitwise reproducibility of FA4's deterministic backward: digests, guard bands, config matrix,
in-process runner, fresh-process orchestration, digest manifests and timing.

What is checked
---------------
For every configuration of the matrix, FA4's backward with ``deterministic=True`` runs ``runs``
times in each of ``processes`` freshly started Python processes (and on each selected device). Before
every run the output buffers dQ, dK, dV are re-armed: the interior is filled with NaN and
``guard`` extra elements before and after each buffer hold a sentinel bit pattern
(:data:`SENTINEL_BITS`, a signalling-NaN payload no kernel produces). After every run

* the guard bands must still hold the sentinel bit for bit (else: out-of-bounds write),
* the interior must hold no NaN (else: an element was never written, or a NaN was produced),
* the SHA-256 digest of the raw bytes of dQ, dK, dV (and dsink) is recorded.

The configuration is *reproducible* when every run, in every process, on every device, gives the
same digest for every tensor, the inputs' digest being the same everywhere (inputs are generated on
the CPU from the configuration's seed, so a changed generator cannot masquerade as
non-determinism). The default (non-deterministic) mode is run too, and its divergence is measured
bitwise: elements that differ from the first default run, and the largest difference in ULPs of the
output dtype (sign-magnitude integer distance, so a step across zero counts one ULP per
representable value crossed).

Statuses (:data:`STATUSES`): ``reproducible``, ``not-reproducible``, ``guard-violation``,
``unwritten`` (NaN left in the output), ``unsupported`` ("not supported by FA4 for this
configuration": FA4 rejected it with an assertion or ValueError before running it), ``xfail``
(not reproducible, but upstream marks the configuration xfail on this arch), ``xpass``
(reproducible although upstream marks it xfail), ``error`` (anything else: a crash, a missing
backend), ``not-run`` (the time budget ran out).

Where figures come from: the ``fa4`` backend runs the production kernels through
``fa4verify.kernels.adapter`` ("measured on <GPU>"); ``twin`` runs the CPU twin
(``fa4verify.kernels.twin.attention``, "CPU twin"); ``torch-math`` is an fp32 PyTorch reference
that exercises the harness itself on the CPU ("CPU"). A backend can also be named ``module:attr``.

Possible issues
---------------
* Bitwise reproducibility is a property of (kernel, configuration, GPU, driver, versions). A
  manifest recorded elsewhere is compared as "different environment", never as a failure, unless
  ``strict_env`` is asked for.
* Fresh processes share nothing but the files on disk. FA4's optional on-disk kernel cache
  (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) is turned off in the workers, so every process
  compiles its own kernels.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

SCHEMA_MANIFEST = "fa4verify.determinism.manifest/1"
SCHEMA_REPORT = "fa4verify.determinism.report/1"
SCHEMA_WORKER = "fa4verify.determinism.worker/1"

TENSORS = ("dq", "dk", "dv", "dsink")
GUARDED = ("dq", "dk", "dv")
STATUSES = ("reproducible", "not-reproducible", "guard-violation", "unwritten", "unsupported",
            "xfail", "xpass", "error", "not-run")
#: statuses that make ``fa4verify determinism`` exit 1
FAILING = frozenset({"not-reproducible", "guard-violation", "unwritten", "error"})
UNSUPPORTED_MSG = "not supported by FA4 for this configuration"

# --------------------------------------------------------------------------------------------
# Bit-level helpers (torch; any device)
# --------------------------------------------------------------------------------------------

#: dtype name -> (integer view dtype name, exponent mask, mantissa mask, sign bit)
_FORMATS: dict[str, tuple[str, int, int, int]] = {
    "bfloat16": ("int16", 0x7F80, 0x007F, 0x8000),
    "float16": ("int16", 0x7C00, 0x03FF, 0x8000),
    "float32": ("int32", 0x7F800000, 0x007FFFFF, 0x80000000),
}

#: Guard-band sentinel per dtype: a signalling NaN with a payload (quiet bit clear), so neither a
#: finite value nor the canonical quiet NaN a kernel may write can equal it.
SENTINEL_BITS: dict[str, int] = {"bfloat16": 0x7F8A, "float16": 0x7C5A, "float32": 0x7F8A5A5A}

#: default guard width in bytes on each side (a multiple of 128 B keeps TMA alignment)
GUARD_BYTES = 4096


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


# --------------------------------------------------------------------------------------------
# Guard bands
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GuardReport:
    """Result of checking one guarded buffer after a run: elements of the guard bands whose bits
    no longer equal the sentinel (``before``/``after`` counts, first offending offsets relative to
    the buffer start, negative before it) and NaN elements left in the interior."""
    name: str
    before: int
    after: int
    first_offsets: tuple[int, ...]
    nan_interior: int

    @property
    def guard_ok(self) -> bool:
        return self.before == 0 and self.after == 0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["first_offsets"] = list(self.first_offsets)
        return d


class GuardedBuffer:
    """An output buffer of ``shape``/``dtype`` with ``guard`` sentinel elements on each side.

    ``view`` is a contiguous view of the interior (what the kernel gets); ``storage`` is the whole
    allocation. :meth:`arm` writes the sentinel into the guard bands and NaN into the interior;
    :meth:`check` reports any change of the guard bands and any NaN left in the interior.
    """

    def __init__(self, name: str, shape: Sequence[int], dtype, device, guard: int | None = None,
                 guard_bytes: int | None = None):
        torch = _torch()
        self.name = name
        self.dtype = dtype
        self.dtype_name = str(dtype).replace("torch.", "")
        if self.dtype_name not in _FORMATS:
            raise TypeError(f"GuardedBuffer: unsupported dtype {dtype}")
        elsize = torch.empty((), dtype=dtype).element_size()
        if guard is None:
            guard = -(-int(guard_bytes if guard_bytes is not None else GUARD_BYTES) // elsize)
        self.guard = int(guard)
        if self.guard < 1:
            raise ValueError("guard must be >= 1 element")
        self.numel = int(math.prod(shape))
        self.storage = torch.empty(self.numel + 2 * self.guard, dtype=dtype, device=device)
        self.view = self.storage[self.guard:self.guard + self.numel].view(tuple(shape))
        nb = 16 if _FORMATS[self.dtype_name][0] == "int16" else 32
        self.sentinel = _signed(SENTINEL_BITS[self.dtype_name], nb)

    def arm(self) -> None:
        b = self.storage.view(getattr(_torch(), _FORMATS[self.dtype_name][0]))
        b.fill_(self.sentinel)
        self.view.fill_(float("nan"))

    def check(self, max_offsets: int = 5) -> GuardReport:
        torch = _torch()
        b = self.storage.view(getattr(torch, _FORMATS[self.dtype_name][0]))
        g, n = self.guard, self.numel
        bad_before = (b[:g] != self.sentinel).nonzero().reshape(-1)
        bad_after = (b[g + n:] != self.sentinel).nonzero().reshape(-1)
        offs = [int(i) - g for i in bad_before[:max_offsets].tolist()]
        offs += [n + int(i) for i in bad_after[:max(0, max_offsets - len(offs))].tolist()]
        return GuardReport(self.name, int(bad_before.numel()), int(bad_after.numel()), tuple(offs),
                           nan_count(self.view))

    def aliases(self, t) -> bool:
        """Whether ``t`` is this buffer's interior (same data pointer, shape and dtype)."""
        torch = _torch()
        return (isinstance(t, torch.Tensor) and t.data_ptr() == self.view.data_ptr()
                and tuple(t.shape) == tuple(self.view.shape) and t.dtype == self.view.dtype)


# --------------------------------------------------------------------------------------------
# Configuration matrix
# --------------------------------------------------------------------------------------------

Dtype = Literal["bf16", "fp16"]
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class DeterminismConfig:
    """One backward problem. Layout as FA4: (batch, seqlen, nheads, head_dim); with ``varlen``
    the batch is packed to (total, nheads, head_dim) with ``seqlens_q``/``seqlens_k`` per sequence.

    ``window`` is FA4's ``window_size=(left, right)`` (None = unbounded); ``causal`` and a window
    are mutually exclusive here. ``upstream_xfail`` names the arches on which upstream's tests mark
    the configuration xfail for deterministic backward, with the reason (a non-reproducible result
    there is reported as ``xfail``, not a failure).
    """
    name: str
    batch: int = 2
    seqlen_q: int = 512
    seqlen_k: int = 512
    nheads: int = 8
    nheads_kv: int = 8
    head_dim: int = 128
    head_dim_v: int | None = None
    causal: bool = False
    window: tuple[int | None, int | None] = (None, None)
    softcap: float = 0.0
    sink: bool = False
    varlen: bool = False
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    dtype: Dtype = "bf16"
    seed: int = 0
    upstream_xfail: tuple[tuple[str, str], ...] = ()

    @property
    def hdv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def local(self) -> bool:
        return self.window != (None, None)

    @property
    def attention(self) -> str:
        if self.nheads_kv == self.nheads:
            return "mha"
        return "mqa" if self.nheads_kv == 1 else "gqa"

    @property
    def mask(self) -> str:
        return "causal" if self.causal else ("local" if self.local else "full")

    def shape_key(self) -> str:
        if self.varlen:
            sq = ",".join(map(str, self.seqlens_q))
            sk = ",".join(map(str, self.seqlens_k))
            s = f"varlen[q={sq};k={sk}]"
        else:
            s = f"b{self.batch}.sq{self.seqlen_q}.sk{self.seqlen_k}"
        return f"{s}.h{self.nheads}.hkv{self.nheads_kv}.d{self.head_dim}.dv{self.hdv}"

    def key(self) -> str:
        """Manifest key: configuration name, features, shape, dtype and seed."""
        feats = [self.mask]
        if self.local:
            feats.append(f"w{self.window[0]},{self.window[1]}")
        if self.softcap:
            feats.append(f"softcap{self.softcap:g}")
        if self.sink:
            feats.append("sink")
        return f"{self.name}|{'+'.join(feats)}|{self.shape_key()}|{self.dtype}|seed{self.seed}"

    def xfail_reason(self, arch: str | None) -> str | None:
        for a, why in self.upstream_xfail:
            if arch is not None and a == arch:
                return why
        return None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        d["seqlens_q"] = list(self.seqlens_q)
        d["seqlens_k"] = list(self.seqlens_k)
        d["upstream_xfail"] = [list(x) for x in self.upstream_xfail]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DeterminismConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown configuration field(s): {sorted(unknown)}")
        d = dict(d)
        if "window" in d:
            d["window"] = tuple(d["window"])
        for k in ("seqlens_q", "seqlens_k"):
            if k in d:
                d[k] = tuple(int(x) for x in d[k])
        if "upstream_xfail" in d:
            d["upstream_xfail"] = tuple(tuple(x) for x in d["upstream_xfail"])
        return cls(**d)


def validate_config(cfg: DeterminismConfig) -> list[str]:
    """Problems with a configuration, as messages naming the field and value (empty if valid).

    These are the harness's own rules (shapes that make sense, FA4's generic head-dim range of
    8..256 in multiples of 8 for 16-bit inputs); *whether FA4 accepts the configuration on a given
    arch* is decided by FA4 itself at run time and reported as ``unsupported``.
    """
    e: list[str] = []
    if not cfg.name or any(c in cfg.name for c in "|\n "):
        e.append(f"name {cfg.name!r} must be non-empty without '|', spaces or newlines")
    if cfg.dtype not in _TORCH_DTYPES:
        e.append(f"dtype {cfg.dtype!r} must be one of {sorted(_TORCH_DTYPES)}")
    for f in ("nheads", "nheads_kv"):
        if getattr(cfg, f) < 1:
            e.append(f"{f}={getattr(cfg, f)} must be >= 1")
    if cfg.nheads >= 1 and cfg.nheads_kv >= 1 and cfg.nheads % cfg.nheads_kv:
        e.append(f"nheads={cfg.nheads} must be a multiple of nheads_kv={cfg.nheads_kv}")
    for f, v in (("head_dim", cfg.head_dim), ("head_dim_v", cfg.hdv)):
        if not (8 <= v <= 256) or v % 8:
            e.append(f"{f}={v} must be in 8..256 and a multiple of 8")
    if cfg.causal and cfg.local:
        e.append(f"causal=True and window={cfg.window} are exclusive (use one)")
    for w in cfg.window:
        if w is not None and (not isinstance(w, int) or w < 0):
            e.append(f"window={cfg.window}: each side must be None or an int >= 0")
    if not (cfg.softcap >= 0.0) or math.isinf(cfg.softcap):
        e.append(f"softcap={cfg.softcap} must be finite and >= 0")
    if cfg.seed < 0:
        e.append(f"seed={cfg.seed} must be >= 0")
    if cfg.varlen:
        if not cfg.seqlens_q or len(cfg.seqlens_q) != len(cfg.seqlens_k):
            e.append(f"varlen needs seqlens_q and seqlens_k of equal, non-zero length; got "
                     f"{len(cfg.seqlens_q)} and {len(cfg.seqlens_k)}")
        if any(s < 0 for s in cfg.seqlens_q + cfg.seqlens_k):
            e.append("varlen sequence lengths must be >= 0")
        if cfg.seqlens_q and sum(cfg.seqlens_q) == 0:
            e.append("varlen seqlens_q must not all be 0")
    else:
        if cfg.seqlens_q or cfg.seqlens_k:
            e.append("seqlens_q/seqlens_k are only for varlen=True")
        for f in ("batch", "seqlen_q", "seqlen_k"):
            if getattr(cfg, f) < 1:
                e.append(f"{f}={getattr(cfg, f)} must be >= 1")
    for a, why in cfg.upstream_xfail:
        if a not in ("sm90", "sm100", "sm103", "sm110", "sm120") or not why:
            e.append(f"upstream_xfail entry {(a, why)!r}: arch must be smXX and a reason given")
    return e


_XF_SM90_192 = ("sm90", "upstream tests/cute/test_flash_attn_race_condition.py: "
                "'headdim 192 not supported on sm90' (xfail) -- fa4_numerics.md §10.3")
_XF_SM90_256 = ("sm90", "upstream tests/cute/test_flash_attn.py marks SM90 hd>192 backward xfail "
                "-- fa4_numerics.md §7.2; FA4 4.0.0b36 accepts it (tile 64x48, interface.py "
                "_tile_size_bwd_sm90)")

#: Named matrices. ``h200`` is sized to run 100 x 3 processes inside a few minutes on one H200;
#: shapes sit on and off the SM90 backward tiles (hd<=64: 128x128; hd128: 80x128 non-causal,
#: 64x128 causal/local; hd192: 64x96; hd256: 64x48 -- interface.py ``_tile_size_bwd_sm90``).
MATRICES: dict[str, tuple[DeterminismConfig, ...]] = {
    "h200": (
        DeterminismConfig("mha-hd64-full-edge", batch=2, seqlen_q=1000, seqlen_k=1029, nheads=8,
                          nheads_kv=8, head_dim=64),
        DeterminismConfig("mha-hd128-causal", batch=2, seqlen_q=1027, seqlen_k=1027, nheads=8,
                          nheads_kv=8, head_dim=128, causal=True, seed=1),
        DeterminismConfig("gqa-hd128-full-tile", batch=2, seqlen_q=1040, seqlen_k=1040, nheads=8,
                          nheads_kv=2, head_dim=128, seed=2),
        DeterminismConfig("mqa-hd128-causal-sq<sk", batch=2, seqlen_q=700, seqlen_k=1024,
                          nheads=8, nheads_kv=1, head_dim=128, causal=True, seed=3),
        DeterminismConfig("mha-hd128-local", batch=2, seqlen_q=1024, seqlen_k=1024, nheads=8,
                          nheads_kv=8, head_dim=128, window=(256, 64), seed=4),
        DeterminismConfig("gqa-hd64-local-softcap", batch=2, seqlen_q=513, seqlen_k=513,
                          nheads=8, nheads_kv=4, head_dim=64, window=(100, 0), softcap=15.0,
                          seed=5),
        DeterminismConfig("mha-hd128-softcap", batch=2, seqlen_q=513, seqlen_k=513, nheads=8,
                          nheads_kv=8, head_dim=128, softcap=15.0, seed=6),
        DeterminismConfig("mha-hd128-causal-sink", batch=2, seqlen_q=640, seqlen_k=640, nheads=8,
                          nheads_kv=8, head_dim=128, causal=True, sink=True, seed=7),
        DeterminismConfig("gqa-hd64-varlen-causal", nheads=8, nheads_kv=2, head_dim=64,
                          causal=True, varlen=True, seqlens_q=(300, 1, 513, 128, 0, 77),
                          seqlens_k=(300, 1, 513, 128, 5, 77), seed=8),
        DeterminismConfig("mha-hd128-varlen-full", nheads=4, nheads_kv=4, head_dim=128,
                          varlen=True, seqlens_q=(129, 1000, 64), seqlens_k=(257, 640, 1),
                          seed=9),
        DeterminismConfig("mha-fp16-hd128-full", batch=2, seqlen_q=512, seqlen_k=768, nheads=8,
                          nheads_kv=8, head_dim=128, dtype="fp16", seed=10),
        DeterminismConfig("mha-hd64-tiny-edge", batch=3, seqlen_q=1, seqlen_k=129, nheads=2,
                          nheads_kv=2, head_dim=64, seed=11),
        DeterminismConfig("mha-hd192-dv128-causal", batch=2, seqlen_q=1000, seqlen_k=1000,
                          nheads=8, nheads_kv=8, head_dim=192, head_dim_v=128, causal=True,
                          seed=12, upstream_xfail=(_XF_SM90_192,)),
        DeterminismConfig("gqa-hd192-dv128", batch=2, seqlen_q=512, seqlen_k=512, nheads=8,
                          nheads_kv=2, head_dim=192, head_dim_v=128, seed=13,
                          upstream_xfail=(_XF_SM90_192,)),
        DeterminismConfig("mha-hd256-full", batch=2, seqlen_q=520, seqlen_k=520, nheads=4,
                          nheads_kv=4, head_dim=256, seed=14, upstream_xfail=(_XF_SM90_256,)),
        DeterminismConfig("gqa-hd256-causal", batch=1, seqlen_q=500, seqlen_k=500, nheads=4,
                          nheads_kv=2, head_dim=256, causal=True, seed=15,
                          upstream_xfail=(_XF_SM90_256,)),
    ),
    # small problems for CPU backends (twin, torch-math) and CI
    "cpu": (
        DeterminismConfig("mha-hd64-full", batch=1, seqlen_q=33, seqlen_k=47, nheads=2,
                          nheads_kv=2, head_dim=64),
        DeterminismConfig("gqa-hd64-causal", batch=1, seqlen_q=40, seqlen_k=40, nheads=4,
                          nheads_kv=2, head_dim=64, causal=True, seed=1),
        DeterminismConfig("mqa-hd128-local-softcap", batch=1, seqlen_q=24, seqlen_k=31, nheads=2,
                          nheads_kv=1, head_dim=128, window=(8, 3), softcap=15.0, seed=2),
        DeterminismConfig("mha-hd64-sink", batch=1, seqlen_q=20, seqlen_k=20, nheads=2,
                          nheads_kv=2, head_dim=64, sink=True, seed=3),
        DeterminismConfig("mha-hd64-varlen", nheads=2, nheads_kv=2, head_dim=64, varlen=True,
                          seqlens_q=(5, 0, 17), seqlens_k=(9, 3, 17), seed=4),
        # >= 3 KV tiles (SM90 tile_n = 128 for hd <= 128): with 1 or 2 partial sums per dQ
        # element the order of the fp32 reduce-adds cannot change the result (commutativity),
        # so an order fault is only observable from 3 tiles on.
        DeterminismConfig("mha-hd64-kv-tiles", batch=1, seqlen_q=24, seqlen_k=520, nheads=1,
                          nheads_kv=1, head_dim=64, seed=5),
        DeterminismConfig("mqa-hd128-causal-kv-tiles", batch=1, seqlen_q=64, seqlen_k=400,
                          nheads=2, nheads_kv=1, head_dim=128, causal=True, seed=6),
    ),
}
#: timing shapes (deterministic vs default cost): the paper's setting is hd128, causal and not.
TIMING_CONFIGS: tuple[DeterminismConfig, ...] = (
    DeterminismConfig("time-mha-hd128-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=128, causal=True),
    DeterminismConfig("time-mha-hd128-full", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=128),
    DeterminismConfig("time-gqa-hd128-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=4, head_dim=128, causal=True),
    DeterminismConfig("time-mha-hd64-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=64, causal=True),
)


def select_configs(spec: str | Sequence[str] | None, default: str = "h200"
                   ) -> tuple[DeterminismConfig, ...]:
    """Resolve ``--configs``: matrix names (``h200``, ``cpu``), configuration names from any
    matrix, a glob over names (``gqa-*``), or ``@file.json`` (a JSON list of configuration
    objects). Comma-separated items are allowed. Raises ``ValueError`` naming an unknown item or an
    invalid configuration; duplicates (same :meth:`DeterminismConfig.key`) are removed."""
    import fnmatch
    items: list[str] = []
    if spec is None or spec == "" or spec == ():
        items = [default]
    else:
        for s in ([spec] if isinstance(spec, str) else spec):
            items += [x.strip() for x in s.split(",") if x.strip()]
    by_name: dict[str, DeterminismConfig] = {}
    for m in MATRICES.values():
        for c in m:
            by_name.setdefault(c.name, c)
    for c in TIMING_CONFIGS:
        by_name.setdefault(c.name, c)
    out: list[DeterminismConfig] = []
    for it in items:
        if it in MATRICES:
            out += MATRICES[it]
        elif it.startswith("@"):
            path = it[1:]
            try:
                with open(path) as f:
                    raw = json.load(f)
            except (OSError, json.JSONDecodeError) as ex:
                raise ValueError(f"cannot read configurations from {path!r}: {ex}") from None
            if not isinstance(raw, list):
                raise ValueError(f"{path!r} must hold a JSON list of configuration objects")
            for d in raw:
                out.append(DeterminismConfig.from_json(d))
        elif any(ch in it for ch in "*?["):
            hit = [c for n, c in by_name.items() if fnmatch.fnmatchcase(n, it)]
            if not hit:
                raise ValueError(f"configuration pattern {it!r} matches nothing")
            out += hit
        elif it in by_name:
            out.append(by_name[it])
        else:
            raise ValueError(f"unknown configuration or matrix {it!r}; matrices: "
                             f"{sorted(MATRICES)}, e.g. names: {sorted(by_name)[:6]} ...")
    seen, uniq = set(), []
    for c in out:
        errs = validate_config(c)
        if errs:
            raise ValueError(f"invalid configuration {c.name!r}: " + "; ".join(errs))
        if c.key() not in seen:
            seen.add(c.key())
            uniq.append(c)
    return tuple(uniq)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

@dataclass
class Problem:
    """Inputs of one configuration on one device (torch tensors)."""
    cfg: DeterminismConfig
    q: Any
    k: Any
    v: Any
    dout: Any
    sink: Any = None
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    softmax_scale: float = 0.0

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.q, self.k, self.v, self.dout, self.sink, self.cu_seqlens_q,
                  self.cu_seqlens_k):
            h.update(b"none" if t is None else digest(t).encode())
        return h.hexdigest()


def make_inputs(cfg: DeterminismConfig, device: str = "cpu") -> Problem:
    """Inputs from ``cfg.seed``, drawn on the CPU (``torch.Generator``) in fp32 and rounded to the
    dtype, then moved to ``device`` -- so every process and device gets the same bits. q is scaled
    by softcap/4 when softcap is on (as upstream's tests do, so scores reach the cap)."""
    torch = _torch()
    g = torch.Generator(device="cpu").manual_seed(int(cfg.seed))
    dt = getattr(torch, _TORCH_DTYPES[cfg.dtype])
    if cfg.varlen:
        tq, tk = sum(cfg.seqlens_q), sum(cfg.seqlens_k)
        sq_shape, sk_shape = (tq,), (tk,)
    else:
        sq_shape, sk_shape = (cfg.batch, cfg.seqlen_q), (cfg.batch, cfg.seqlen_k)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    q = rnd(*sq_shape, cfg.nheads, cfg.head_dim)
    if cfg.softcap:
        q = q * (cfg.softcap / 4)
    k = rnd(*sk_shape, cfg.nheads_kv, cfg.head_dim)
    v = rnd(*sk_shape, cfg.nheads_kv, cfg.hdv)
    dout = rnd(*sq_shape, cfg.nheads, cfg.hdv)
    sink = rnd(cfg.nheads) if cfg.sink else None
    p = Problem(cfg, *(t.to(dt).to(device) for t in (q, k, v, dout)),
                softmax_scale=1.0 / math.sqrt(cfg.head_dim))
    if sink is not None:
        p.sink = sink.to(device)  # fp32 sink -> fp32 dsink
    if cfg.varlen:
        cq = [0]
        for s in cfg.seqlens_q:
            cq.append(cq[-1] + s)
        ck = [0]
        for s in cfg.seqlens_k:
            ck.append(ck[-1] + s)
        p.cu_seqlens_q = torch.tensor(cq, dtype=torch.int32, device=device)
        p.cu_seqlens_k = torch.tensor(ck, dtype=torch.int32, device=device)
        p.max_seqlen_q, p.max_seqlen_k = max(cfg.seqlens_q), max(cfg.seqlens_k)
    return p


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------

@dataclass
class Grads:
    """Gradients of one backward run. ``extra``: further tensors the backend exposes and that
    are digested and compared like the gradients (the twin's fp32 ``dq_accum``)."""
    dq: Any
    dk: Any
    dv: Any
    dsink: Any = None
    config: Any = None
    extra: dict = field(default_factory=dict)


class UnsupportedConfig(Exception):
    """The kernel under test rejected the configuration before running it."""


class Backend:
    """What the runner needs from a kernel. Subclasses set ``name``, ``where`` (figure label) and
    ``writes_into_buffers`` (True when :meth:`backward` honours the given dq/dk/dv buffers)."""
    name = "abstract"
    where = "CPU"
    writes_into_buffers = False
    arch: str | None = None
    #: how a rejection is reported ("<stage> <unsupported_msg> (...)")
    unsupported_msg = "not supported by the kernel for this configuration"

    def environment(self, device: str) -> dict[str, str]:
        raise NotImplementedError

    def forward(self, p: Problem) -> tuple[Any, Any]:
        raise NotImplementedError

    def backward(self, p: Problem, out, lse, *, deterministic: bool, dq=None, dk=None,
                 dv=None) -> Grads:
        raise NotImplementedError

    def synchronize(self, device: str) -> None:
        pass

    def classify(self, exc: BaseException) -> str:
        """``"unsupported"`` if ``exc`` is the kernel rejecting the configuration, else ``"error"``."""
        if isinstance(exc, UnsupportedConfig):
            return "unsupported"
        return "error"


def _common_env() -> dict[str, str]:
    env = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch
        env["torch"] = torch.__version__
    except Exception:  # pragma: no cover
        env["torch"] = "absent"
    return env


def _pkg_version(name: str) -> str:
    from fa4verify.kernels.facts import dist_version
    return dist_version(name) or "absent"


def _driver_version() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
        for tok in line.split():
            if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
                return tok
    except OSError:
        pass
    return "unknown"


def _call_filtered(fn: Callable, *args, **kwargs):
    """Call ``fn`` with the keyword arguments it accepts. A keyword it does not accept is an error
    if its value is not the neutral default (None/False/0.0/(None, None)) -- a feature the kernel
    interface cannot express must not be silently dropped."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    use = {}
    for k, v in kwargs.items():
        if k in params:
            use[k] = v
        elif v not in (None, False, 0.0, (None, None)):
            raise TypeError(f"{getattr(fn, '__qualname__', fn)} has no parameter {k!r} "
                            f"(needed: {k}={v!r})")
    return fn(*args, **use)


def _features(p: Problem) -> dict:
    c = p.cfg
    return dict(softmax_scale=p.softmax_scale, causal=c.causal, window_size=tuple(c.window),
                softcap=c.softcap, learnable_sink=p.sink, cu_seqlens_q=p.cu_seqlens_q,
                cu_seqlens_k=p.cu_seqlens_k, max_seqlen_q=p.max_seqlen_q,
                max_seqlen_k=p.max_seqlen_k)


class Fa4Backend(Backend):
    """Production FA4 through ``fa4verify.kernels.adapter`` (the one importer of flash_attn.cute for production kernels)."""
    name = "fa4"
    writes_into_buffers = True
    unsupported_msg = UNSUPPORTED_MSG

    def __init__(self) -> None:
        self.adapter = importlib.import_module("fa4verify.kernels.adapter")
        ok, reason = self.adapter.cuda_status()
        if not ok:
            raise EnvironmentError(f"no CUDA device: {reason}")
        import torch
        cc = torch.cuda.get_device_capability()
        self.arch = f"sm{cc[0]}{cc[1]}"
        # Note [adapter provenance cost]: adapter.versions() is called on every forward/backward
        # (importlib.metadata lookups, ~0.1 s each on a slow host), which would dominate a
        # 100-run loop. The versions cannot change inside a process, so this process answers
        # from a snapshot taken once; every call still records them in its CallConfig.
        if not getattr(self.adapter.versions, "_fa4v_cached", False):
            snap = self.adapter.versions()

            def _cached_versions(_snap=snap):
                return dict(_snap)
            _cached_versions._fa4v_cached = True  # type: ignore[attr-defined]
            _cached_versions.__doc__ = self.adapter.versions.__doc__
            self.adapter.versions = _cached_versions
        self.where = f"measured on {torch.cuda.get_device_name()}"

    def environment(self, device: str) -> dict[str, str]:
        import torch
        env = _common_env()
        idx = torch.device(device).index or 0
        env.update(gpu=torch.cuda.get_device_name(idx),
                   compute_capability=".".join(map(str, torch.cuda.get_device_capability(idx))),
                   driver=_driver_version(), cuda=str(torch.version.cuda),
                   fa4=_pkg_version("flash-attn-4"), dsl=_pkg_version("nvidia-cutlass-dsl"))
        try:
            v = self.adapter.versions()
            if isinstance(v, Mapping):
                for k2, val in v.items():
                    env.setdefault(f"adapter.{k2}", str(val))
        except Exception:  # noqa: BLE001 - versions() is informative only
            pass
        return env

    def forward(self, p: Problem):
        r = _call_filtered(self.adapter.forward, p.q, p.k, p.v, return_lse=True, **_features(p))
        return r.out, r.lse

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        r = _call_filtered(self.adapter.backward, p.q, p.k, p.v, out, p.dout, lse,
                           deterministic=deterministic, dq=dq, dk=dk, dv=dv, **_features(p))
        return Grads(r.dq, r.dk, r.dv, getattr(r, "dsink", None), getattr(r, "config", None))

    def synchronize(self, device: str) -> None:
        import torch
        torch.cuda.synchronize(device)

    def classify(self, exc: BaseException) -> str:
        unsupported = tuple(getattr(self.adapter, n) for n in
                            ("UnsupportedConfigError", "UnsupportedError", "Unsupported")
                            if isinstance(getattr(self.adapter, n, None), type))
        if isinstance(exc, (AssertionError, NotImplementedError, ValueError, UnsupportedConfig)
                      + unsupported):
            return "unsupported"
        return "error"


class TorchMathBackend(Backend):
    """fp32 PyTorch math attention (autograd), results rounded to the input dtype and copied into
    the given buffers. A reference that exercises the harness on the CPU; not FA4."""
    name = "torch-math"
    where = "CPU"
    writes_into_buffers = True

    def environment(self, device: str) -> dict[str, str]:
        env = _common_env()
        env.update(backend="torch-math", device=device)
        return env

    @staticmethod
    def _segments(p: Problem):
        c = p.cfg
        if not c.varlen:
            return [(b, None, None) for b in range(c.batch)]
        cq, ck = p.cu_seqlens_q.tolist(), p.cu_seqlens_k.tolist()
        return [(i, (cq[i], cq[i + 1]), (ck[i], ck[i + 1])) for i in range(len(cq) - 1)]

    def _attn(self, p: Problem, q, k, v, sink):
        """q (sq, h, d), k/v (sk, hkv, d) fp32 -> out (sq, h, dv), lse (h, sq)."""
        torch = _torch()
        c = p.cfg
        rep = c.nheads // c.nheads_kv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kk) * p.softmax_scale
        if c.softcap:
            s = torch.tanh(s / c.softcap) * c.softcap
        sq, sk = q.shape[0], k.shape[0]
        i = torch.arange(sq).unsqueeze(1) + (sk - sq)
        j = torch.arange(sk).unsqueeze(0)
        allow = torch.ones(sq, sk, dtype=torch.bool)
        left, right = (None, 0) if c.causal else c.window
        if right is not None:
            allow &= j <= i + right
        if left is not None:
            allow &= j >= i - left
        s = s.masked_fill(~allow, float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, sq, 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1)
        pr = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        if sink is not None:
            pr = pr[..., :-1]
        out = torch.einsum("hqk,khd->qhd", pr, vv)
        return out, lse

    def _run(self, p: Problem, grad: bool):
        torch = _torch()
        q = p.q.float().requires_grad_(grad)
        k = p.k.float().requires_grad_(grad)
        v = p.v.float().requires_grad_(grad)
        sink = p.sink.float().requires_grad_(grad) if p.sink is not None else None
        outs, lses = [], []
        for b, rq, rk in self._segments(p):
            if rq is None:
                o, l = self._attn(p, q[b], k[b], v[b], sink)
            else:
                o, l = self._attn(p, q[rq[0]:rq[1]], k[rk[0]:rk[1]], v[rk[0]:rk[1]], sink)
            outs.append(o)
            lses.append(l)
        if p.cfg.varlen:
            out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
        else:
            out, lse = torch.stack(outs, 0), torch.stack(lses, 0)
        return out, lse, (q, k, v, sink)

    def forward(self, p: Problem):
        with _torch().no_grad():
            out, lse, _ = self._run(p, False)
        return out.to(p.q.dtype), lse

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        torch = _torch()
        o, _, (q, k, v, sink) = self._run(p, True)
        ins = [t for t in (q, k, v, sink) if t is not None]
        gs = torch.autograd.grad(o, ins, p.dout.float())
        res = []
        for g, buf, ref in zip(gs[:3], (dq, dk, dv), (p.q, p.k, p.v)):
            g = g.to(ref.dtype)
            if buf is not None:
                buf.copy_(g)
                g = buf
            res.append(g)
        dsink = gs[3].to(p.sink.dtype) if sink is not None else None
        return Grads(*res, dsink=dsink)


class TwinBackend(Backend):
    """The CPU twin ``fa4verify.kernels.twin.attention`` (numpy). It returns its own arrays, so
    guard bands do not apply; its fixed accumulation order (``deterministic=True``) must be
    bitwise reproducible. Besides dQ/dK/dV it exposes the fp32 ``dq_accum`` (before the scale
    and the cast to bf16/fp16), which is digested too: an order change moves fp32 sums by an ULP
    or so, which the bf16 cast hides for all but ~1e-4 of the elements (CPU twin, sq=1024,
    5 KV tiles: 0-4 of 65536 dQ elements per run), while ``dq_accum`` shows it almost surely.
    Varlen is not modelled (``unsupported``)."""
    name = "twin"
    where = "CPU twin"
    writes_into_buffers = False
    unsupported_msg = "not modelled by the CPU twin for this configuration"

    def __init__(self, arch: str = "sm90", mutations: Iterable[str] = ()) -> None:
        self.twin = importlib.import_module("fa4verify.kernels.twin.attention")
        self.arch = arch
        self.mutations = frozenset(mutations)

    def environment(self, device: str) -> dict[str, str]:
        import numpy as np
        env = _common_env()
        env.update(backend="twin", arch=self.arch, numpy=np.__version__,
                   mutations=",".join(sorted(self.mutations)) or "none")
        return env

    def _kw(self, p: Problem) -> dict:
        if p.cfg.varlen:
            raise UnsupportedConfig("varlen is not modelled by the CPU twin")
        c = p.cfg
        sink = None if p.sink is None else p.sink.detach().cpu().float().numpy()
        return dict(arch=self.arch, softmax_scale=p.softmax_scale, causal=c.causal,
                    window_size=tuple(c.window), softcap=c.softcap, learnable_sink=sink,
                    dtype=c.dtype)

    def forward(self, p: Problem):
        r = self.twin.forward(p.q, p.k, p.v, **self._kw(p))
        return r.out, getattr(r, "lse", None)

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        kw = self._kw(p)
        if self.mutations:
            kw["mutations"] = self.mutations
        r = self.twin.backward(p.q, p.k, p.v, out, p.dout, lse=lse, deterministic=deterministic,
                               **kw)
        extra = {}
        acc = getattr(r, "stages", {}).get("dq_accum") if hasattr(r, "stages") else None
        if acc is not None:
            extra["dq_accum"] = acc  # fp32, before x scale and the cast: shows order faults
        return Grads(r.dq, r.dk, r.dv, getattr(r, "dsink", None), extra=extra)

    def classify(self, exc: BaseException) -> str:
        if isinstance(exc, (NotImplementedError, UnsupportedConfig)):
            return "unsupported"
        return "error"


def load_backend(spec: str, **kwargs) -> Backend:
    """``fa4`` | ``twin`` | ``torch-math`` | ``module:attr`` (a Backend subclass or factory).
    Raises ``EnvironmentError`` (no GPU, no adapter) or ``ImportError`` with the reason."""
    if spec == "fa4":
        try:
            return Fa4Backend()
        except ModuleNotFoundError as ex:
            if ex.name and ex.name.startswith("fa4verify.kernels.adapter"):
                raise EnvironmentError("fa4verify.kernels.adapter is not available "
                                       "(the production adapter has not landed)") from None
            raise EnvironmentError(f"FA4 adapter import failed: {ex}") from None
    if spec == "torch-math":
        return TorchMathBackend()
    if spec.startswith("twin"):
        # twin | twin:sm100 | twin:sm90+mutation1+mutation2
        rest = spec[4:].lstrip(":")
        parts = [x for x in rest.split("+") if x] if rest else []
        arch = parts[0] if parts and parts[0].startswith("sm") else "sm90"
        muts = [x for x in parts if not x.startswith("sm")]
        return TwinBackend(arch=arch, mutations=muts)
    if ":" in spec:
        mod, attr = spec.split(":", 1)
        obj = getattr(importlib.import_module(mod), attr)
        return obj(**kwargs) if callable(obj) else obj
    raise ValueError(f"unknown backend {spec!r} (fa4, twin[:smXX[+mutation]], torch-math, "
                     "module:attr)")


# --------------------------------------------------------------------------------------------
# In-process runner
# --------------------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:400]


class _DistinctDigests:
    """Per tensor: digest -> [count, first run index]."""

    def __init__(self) -> None:
        self.by_tensor: dict[str, dict[str, list[int]]] = {}

    def add(self, name: str, dg: str, run: int) -> None:
        d = self.by_tensor.setdefault(name, {})
        if dg in d:
            d[dg][0] += 1
        else:
            d[dg] = [1, run]

    def to_json(self) -> dict:
        return {k: {dg: {"count": c, "first_run": r} for dg, (c, r) in v.items()}
                for k, v in self.by_tensor.items()}


def _grad_tensors(g: Grads) -> dict[str, Any]:
    d = {"dq": g.dq, "dk": g.dk, "dv": g.dv}
    if g.dsink is not None:
        d["dsink"] = g.dsink
    for k, v in (g.extra or {}).items():
        if k in d:
            raise ValueError(f"extra tensor {k!r} shadows a gradient")
        d[k] = v
    return d


def _tensor_names(recs: Iterable[Mapping[str, Any]], mode: str = "det") -> list[str]:
    names = {t for x in recs for t in x.get(mode, {}).get("digests", {})}
    return [t for t in TENSORS if t in names] + sorted(names - set(TENSORS))


def _clone(t):
    torch = _torch()
    if isinstance(t, torch.Tensor):
        return t.detach().clone()
    import numpy as np
    return np.array(t, copy=True)


def _select_device(device: str) -> None:
    """Make ``device`` current (FA4 launches on the current device's stream)."""
    if device.startswith("cuda"):
        _torch().cuda.set_device(device)


def run_config(backend: Backend, cfg: DeterminismConfig, device: str, *, runs: int,
               default_runs: int = 0, guard_bytes: int | None = None,
               deadline: float | None = None) -> dict:
    """Run one configuration ``runs`` times deterministically (and ``default_runs`` times in
    default mode) in this process on ``device``. Returns a JSON-able dict (the worker record):

    ``status`` (``ok`` | ``unsupported`` | ``error`` | ``not-run``), ``inputs_digest``,
    ``fwd_digests``, ``det`` = {``digests``: tensor -> digest -> {count, first_run},
    ``guard_violations``: [run, report...] (first 5), ``unwritten``: [...], ``runs``},
    ``default`` = {``runs``, ``digests``, ``vs_first``: tensor -> {runs_differing,
    max_differing_elements, max_ulp, numel}, ``vs_deterministic``: tensor -> BitDiff}.
    """
    rec: dict[str, Any] = {"config": cfg.key(), "name": cfg.name, "device": device,
                           "pid": os.getpid(), "status": "ok"}
    if deadline is not None and time.monotonic() > deadline:
        rec.update(status="not-run", reason="time budget exhausted before this configuration")
        return rec
    stage = "inputs"
    t0 = time.perf_counter()
    try:
        torch = _torch()
        _select_device(device)
        p = make_inputs(cfg, device)
        rec["inputs_digest"] = p.digest()
        stage = "forward"
        out, lse = backend.forward(p)
        backend.synchronize(device)
        rec["fwd_digests"] = {"out": digest(out)}
        if lse is not None:
            rec["fwd_digests"]["lse"] = digest(lse)
        bufs: dict[str, GuardedBuffer] = {}
        if backend.writes_into_buffers:
            for n, ref in (("dq", p.q), ("dk", p.k), ("dv", p.v)):
                bufs[n] = GuardedBuffer(n, tuple(ref.shape), ref.dtype, device,
                                        guard_bytes=guard_bytes)

        def one(deterministic: bool):
            for b in bufs.values():
                b.arm()
            if bufs:
                backend.synchronize(device)
            g = backend.backward(p, out, lse, deterministic=deterministic,
                                 dq=bufs["dq"].view if bufs else None,
                                 dk=bufs["dk"].view if bufs else None,
                                 dv=bufs["dv"].view if bufs else None)
            backend.synchronize(device)
            return g

        for mode, n_runs in (("det", runs), ("default", default_runs)):
            if n_runs <= 0:
                continue
            stage = "deterministic backward" if mode == "det" else "default backward"
            dd = _DistinctDigests()
            guard_bad: list[dict] = []
            unwritten: list[dict] = []
            not_aliased: set[str] = set()
            first: dict[str, Any] = {}
            vs_first: dict[str, dict] = {}
            for r in range(n_runs):
                g = one(mode == "det")
                ts = _grad_tensors(g)
                for n, b in bufs.items():
                    if not b.aliases(ts[n]):
                        not_aliased.add(n)
                    rep = b.check()
                    if not rep.guard_ok and len(guard_bad) < 5:
                        guard_bad.append({"run": r, **rep.to_json()})
                    if rep.nan_interior and len(unwritten) < 5:
                        unwritten.append({"run": r, "tensor": n, "nan": rep.nan_interior})
                if not bufs:
                    for n, t in ts.items():
                        c = nan_count(t) if _dtype_name(as_tensor(t)) in _FORMATS else 0
                        if c and len(unwritten) < 5:
                            unwritten.append({"run": r, "tensor": n, "nan": c})
                for n, t in ts.items():
                    dd.add(n, digest(t), r)
                    if r == 0:
                        first[n] = _clone(t)
                    elif mode == "default":
                        bd = compare_bitwise(t, first[n])
                        s = vs_first.setdefault(n, {"runs_differing": 0,
                                                    "max_differing_elements": 0, "max_ulp": 0,
                                                    "numel": bd.numel})
                        if not bd.equal:
                            s["runs_differing"] += 1
                            s["max_differing_elements"] = max(s["max_differing_elements"],
                                                              bd.differing)
                            s["max_ulp"] = max(s["max_ulp"], bd.max_ulp)
                if mode == "det":
                    rec.setdefault("shapes", {n: [list(as_tensor(t).shape),
                                                  _dtype_name(as_tensor(t))]
                                              for n, t in ts.items()})
            m: dict[str, Any] = {"runs": n_runs, "digests": dd.to_json(),
                                 "guard_violations": guard_bad, "unwritten": unwritten,
                                 "buffers_not_used": sorted(not_aliased)}
            if mode == "det":
                det_first = first
            else:
                for n in first:
                    vs_first.setdefault(n, {"runs_differing": 0, "max_differing_elements": 0,
                                            "max_ulp": 0, "numel": int(as_tensor(first[n]).numel())})
                m["vs_first"] = vs_first
                if runs > 0:
                    m["vs_deterministic"] = {n: compare_bitwise(first[n], det_first[n]).to_json()
                                             for n in first if n in det_first}
            rec[mode] = m
            del first
    except Exception as ex:  # noqa: BLE001 - recorded, classified
        kind = backend.classify(ex)
        rec["status"] = kind
        rec["stage"] = stage
        if kind == "unsupported":
            what = "deterministic mode " if stage == "deterministic backward" else ""
            rec["reason"] = f"{what}{backend.unsupported_msg} ({stage}): {_first_line(ex)}"
        else:
            import traceback
            rec["reason"] = f"{stage}: {_first_line(ex)}"
            rec["traceback"] = traceback.format_exc()[-3000:]
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def time_backward(backend: Backend, cfg: DeterminismConfig, device: str, *, reps: int = 20,
                  warmup: int = 3) -> dict:
    """Median backward time (ms) with ``deterministic`` True and False, same inputs, output
    buffers allocated once. CUDA events on a GPU backend, ``perf_counter`` otherwise. The record
    gives ``ratio_det_over_default`` (>1: deterministic is slower) and
    ``det_speed_pct_of_default`` (100 * default_ms / det_ms, the paper's "x% of the speed")."""
    torch = _torch()
    rec: dict[str, Any] = {"config": cfg.key(), "name": cfg.name, "device": device,
                           "reps": reps, "warmup": warmup}
    try:
        _select_device(device)
        p = make_inputs(cfg, device)
        out, lse = backend.forward(p)
        dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
        cuda = device.startswith("cuda")
        for det in (False, True, False, True):  # interleave to spread clock drift
            key = "det_ms" if det else "default_ms"
            for _ in range(warmup):
                backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
            backend.synchronize(device)
            ts = []
            for _ in range(reps):
                if cuda:
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
                    e1.record()
                    e1.synchronize()
                    ts.append(e0.elapsed_time(e1))
                else:
                    t0 = time.perf_counter()
                    backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
                    ts.append((time.perf_counter() - t0) * 1e3)
            rec.setdefault(key + "_samples", []).extend(ts)
        for key in ("det_ms", "default_ms"):
            s = sorted(rec[key + "_samples"])
            rec[key] = s[len(s) // 2]
            del rec[key + "_samples"]
        rec["ratio_det_over_default"] = rec["det_ms"] / rec["default_ms"]
        rec["det_speed_pct_of_default"] = 100.0 * rec["default_ms"] / rec["det_ms"]
        c = cfg
        flops_fwd = 4.0 * c.batch * c.nheads * c.seqlen_q * c.seqlen_k * (c.head_dim + c.hdv) / 2
        if c.causal:
            flops_fwd /= 2
        rec["bwd_tflops_default"] = 2.5 * flops_fwd / (rec["default_ms"] * 1e-3) / 1e12
        rec["bwd_tflops_det"] = 2.5 * flops_fwd / (rec["det_ms"] * 1e-3) / 1e12
        rec["status"] = "ok"
    except Exception as ex:  # noqa: BLE001
        rec["status"] = backend.classify(ex)
        rec["reason"] = _first_line(ex)
    return rec


# --------------------------------------------------------------------------------------------
# Fresh processes
# --------------------------------------------------------------------------------------------

def resolve_devices(spec: str, backend_name: str) -> list[str]:
    """``--devices``: ``all``, ``0``, ``0,1`` or ``cpu``. For the fa4 backend indices become
    ``cuda:N``; ``all`` means every visible CUDA device. Raises ValueError on bad input."""
    spec = (spec or "").strip()
    if backend_name != "fa4":
        if spec in ("", "cpu", "all"):
            return ["cpu"]
        raise ValueError(f"--devices {spec!r}: the {backend_name} backend runs on the CPU only")
    torch = _torch()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec in ("", "all"):
        if n == 0:
            raise ValueError("--devices all: no CUDA device visible")
        return [f"cuda:{i}" for i in range(n)] if spec == "all" else ["cuda:0"]
    out = []
    for tok in spec.split(","):
        tok = tok.strip().removeprefix("cuda:")
        if not tok.isdigit():
            raise ValueError(f"--devices {spec!r}: expected 'all' or comma-separated indices")
        if int(tok) >= n:
            raise ValueError(f"--devices {spec!r}: device {tok} does not exist ({n} visible)")
        out.append(f"cuda:{int(tok)}")
    return out


def worker_spec(backend: str, configs: Sequence[DeterminismConfig], devices: Sequence[str], *,
                runs: int, default_runs: int, guard_bytes: int | None = None,
                time_budget_s: float | None = None, timing: bool = False,
                timing_configs: Sequence[DeterminismConfig] = (), timing_reps: int = 20) -> dict:
    return {"schema": SCHEMA_WORKER, "backend": backend,
            "configs": [c.to_json() for c in configs], "devices": list(devices), "runs": runs,
            "default_runs": default_runs, "guard_bytes": guard_bytes, "time_budget_s": time_budget_s,
            "timing": timing, "timing_configs": [c.to_json() for c in timing_configs],
            "timing_reps": timing_reps}


def run_worker_spec(spec: Mapping[str, Any], out_path: str | None = None) -> dict:
    """Body of a worker process (also callable in-process): run every configuration on every
    device; write the JSON record to ``out_path`` after each configuration (so a killed worker
    leaves what it finished)."""
    t_start = time.monotonic()
    deadline = (t_start + float(spec["time_budget_s"])) if spec.get("time_budget_s") else None
    rec: dict[str, Any] = {"schema": SCHEMA_WORKER, "pid": os.getpid(), "results": [],
                           "timing": [], "started": _now()}

    def flush():
        if out_path:
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rec, f)
            os.replace(tmp, out_path)

    try:
        backend = load_backend(spec["backend"])
    except Exception as ex:  # noqa: BLE001
        rec["fatal"] = _first_line(ex)
        rec["fatal_kind"] = "environment" if isinstance(ex, EnvironmentError) else "error"
        flush()
        return rec
    rec["where"] = backend.where
    rec["arch"] = backend.arch
    rec["environment"] = {d: backend.environment(d) for d in spec["devices"]}
    flush()
    configs = [DeterminismConfig.from_json(c) for c in spec["configs"]]
    for cfg in configs:
        for dev in spec["devices"]:
            rec["results"].append(run_config(backend, cfg, dev, runs=int(spec["runs"]),
                                             default_runs=int(spec.get("default_runs", 0)),
                                             guard_bytes=spec.get("guard_bytes"),
                                             deadline=deadline))
            flush()
    if spec.get("timing"):
        for cfg in (DeterminismConfig.from_json(c) for c in spec.get("timing_configs", [])):
            for dev in spec["devices"]:
                rec["timing"].append(time_backward(backend, cfg, dev,
                                                   reps=int(spec.get("timing_reps", 20))))
                flush()
    rec["finished"] = _now()
    rec["seconds"] = round(time.monotonic() - t_start, 3)
    flush()
    return rec


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def spawn_workers(spec: Mapping[str, Any], processes: int, workdir: str, *,
                  parallel: bool = True, timeout_s: float | None = None,
                  env: Mapping[str, str] | None = None) -> list[dict]:
    """Run ``processes`` fresh ``python -m fa4verify.determinism_worker`` processes on ``spec``
    (concurrently when ``parallel``), and return their records (a worker that died leaves
    ``fatal`` plus whatever it had flushed)."""
    os.makedirs(workdir, exist_ok=True)
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    penv = dict(os.environ if env is None else env)
    penv.pop("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", None)  # every process compiles afresh
    penv.setdefault("PYTHONUNBUFFERED", "1")
    procs = []

    def start(i):
        outp = os.path.join(workdir, f"worker{i}.json")
        logp = open(os.path.join(workdir, f"worker{i}.log"), "w")
        pr = subprocess.Popen([sys.executable, "-m", "fa4verify.determinism_worker",
                               "--spec", spec_path, "--out", outp],
                              stdout=logp, stderr=subprocess.STDOUT, env=penv)
        return pr, outp, logp

    def finish(i, pr, outp, logp):
        try:
            rc = pr.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pr.kill()
            rc = pr.wait()
        logp.close()
        try:
            with open(outp) as f:
                r = json.load(f)
        except (OSError, json.JSONDecodeError):
            r = {"schema": SCHEMA_WORKER, "results": [], "timing": []}
        r["process_index"] = i
        r["returncode"] = rc
        if rc != 0 and "fatal" not in r:
            with open(os.path.join(workdir, f"worker{i}.log")) as f:
                tail = f.read()[-2000:]
            r["fatal"] = f"worker exited with status {rc}: {tail.strip()[-400:]}"
            r["fatal_kind"] = "error"
        return r

    records = []
    if parallel:
        procs = [start(i) for i in range(processes)]
        records = [finish(i, *pr) for i, pr in enumerate(procs)]
    else:
        for i in range(processes):
            records.append(finish(i, *start(i)))
    return records


# --------------------------------------------------------------------------------------------
# Aggregation across runs, processes and devices
# --------------------------------------------------------------------------------------------

def aggregate(records: Sequence[Mapping[str, Any]], configs: Sequence[DeterminismConfig]
              ) -> dict:
    """Combine worker records into the report: per configuration a status (:data:`STATUSES`),
    the digests (when all runs, processes and devices agree), and the evidence."""
    arch = next((r.get("arch") for r in records if r.get("arch")), None)
    where = next((r.get("where") for r in records if r.get("where")), None)
    out_cfgs = []
    for cfg in configs:
        key = cfg.key()
        recs = [(r.get("process_index", i), x) for i, r in enumerate(records)
                for x in r.get("results", []) if x.get("config") == key]
        e: dict[str, Any] = {"key": key, "name": cfg.name, "config": cfg.to_json(),
                             "attention": cfg.attention, "mask": cfg.mask,
                             "processes": sorted({p for p, _ in recs}),
                             "devices": sorted({x["device"] for _, x in recs})}
        xf = cfg.xfail_reason(arch)
        if xf:
            e["upstream_xfail"] = xf
        problems: list[str] = []
        status = None
        if not recs:
            status, problems = "not-run", ["no worker produced a result"]
        kinds = {x["status"] for _, x in recs}
        if recs and "unsupported" in kinds:
            status = "unsupported"
            e["reason"] = next(x["reason"] for _, x in recs if x["status"] == "unsupported")
        elif recs and "error" in kinds:
            status = "error"
            e["reason"] = next(x["reason"] for _, x in recs if x["status"] == "error")
        elif recs and kinds == {"not-run"}:
            status = "not-run"
            e["reason"] = recs[0][1].get("reason", "")
        ok = [(p, x) for p, x in recs if x["status"] == "ok"]
        if status is None and ok:
            if len(ok) < len(recs):
                problems.append(f"{len(recs) - len(ok)} process/device result(s) not run")
            e["runs_per_process"] = ok[0][1]["det"]["runs"]
            e["total_runs"] = sum(x["det"]["runs"] for _, x in ok)
            inputs = sorted({x["inputs_digest"] for _, x in ok})
            inputs_differ = len(inputs) > 1
            e["inputs_digest"] = inputs[0] if not inputs_differ else inputs
            if inputs_differ:
                problems.append("inputs differ between processes/devices (generator not "
                                "reproducible): comparison invalid")
            fwd = {json.dumps(x["fwd_digests"], sort_keys=True) for _, x in ok}
            e["forward_reproducible"] = len(fwd) == 1
            if len(fwd) == 1:
                e["fwd_digests"] = json.loads(fwd.pop())
            digests: dict[str, str] = {}
            differing: dict[str, int] = {}
            for t in _tensor_names([x for _, x in ok]):
                seen: dict[str, int] = {}
                for _, x in ok:
                    for dg, v in x["det"]["digests"].get(t, {}).items():
                        seen[dg] = seen.get(dg, 0) + v["count"]
                if not seen:
                    continue
                if len(seen) == 1:
                    digests[t] = next(iter(seen))
                else:
                    differing[t] = len(seen)
            e["digests"] = digests
            e["shapes"] = ok[0][1].get("shapes", {})
            if differing:
                e["distinct_digests"] = differing
            # cross-device: per device, the digests must agree with other devices
            per_dev: dict[str, set] = {}
            for _, x in ok:
                per_dev.setdefault(x["device"], set()).add(json.dumps(
                    {t: sorted(v) for t, v in x["det"]["digests"].items()}, sort_keys=True))
            e["cross_device_equal"] = (len({s for v in per_dev.values() for s in v}) == 1
                                       if len(per_dev) > 1 else None)
            gv = [dict(v, process=p, device=x["device"]) for p, x in ok
                  for v in x["det"]["guard_violations"]]
            uw = [dict(v, process=p, device=x["device"]) for p, x in ok
                  for v in x["det"]["unwritten"]]
            nb = sorted({n for _, x in ok for n in x["det"].get("buffers_not_used", [])})
            if nb:
                problems.append(f"kernel did not write into the given buffers for {nb}: guard "
                                "bands and NaN pre-fill not effective for them")
            if gv:
                e["guard_violations"] = gv[:10]
            if uw:
                e["unwritten"] = uw[:10]
            if "default" in ok[0][1]:
                e["default_mode"] = _aggregate_default(ok)
            if gv:
                status = "guard-violation"
            elif uw:
                status = "unwritten"
            elif differing or inputs_differ:
                status = "xfail" if xf else "not-reproducible"
            else:
                status = "xpass" if xf else "reproducible"
        e["status"] = status
        if problems:
            e["problems"] = problems
        out_cfgs.append(e)
    counts = {s: sum(1 for c in out_cfgs if c["status"] == s) for s in STATUSES}
    return {"schema": SCHEMA_REPORT, "where": where, "arch": arch,
            "configs": out_cfgs, "counts": {k: v for k, v in counts.items() if v}}


def _aggregate_default(ok: Sequence[tuple[int, Mapping[str, Any]]]) -> dict:
    """Default-mode divergence over all processes/devices: per tensor, the largest number of
    elements that differ from the process's first default run, the largest ULP difference, the
    fraction of runs that differed, the number of distinct results, and the difference between
    the first default and the first deterministic result."""
    res: dict[str, Any] = {}
    runs = sum(x["default"]["runs"] for _, x in ok)
    for t in _tensor_names([x for _, x in ok], "default"):
        per = [x["default"].get("vs_first", {}).get(t) for _, x in ok]
        per = [v for v in per if v]
        if not per:
            continue
        distinct = set()
        for _, x in ok:
            distinct |= set(x["default"]["digests"].get(t, {}))
        vd = [x["default"].get("vs_deterministic", {}).get(t) for _, x in ok]
        vd = [v for v in vd if v]
        comp = sum(max(0, x["default"]["runs"] - 1) for _, x in ok)
        res[t] = {
            "numel": per[0]["numel"],
            "runs_compared": comp,
            "runs_differing": sum(v["runs_differing"] for v in per),
            "max_differing_elements": max(v["max_differing_elements"] for v in per),
            "max_differing_fraction": (max(v["max_differing_elements"] for v in per)
                                       / max(1, per[0]["numel"])),
            "max_ulp": max(v["max_ulp"] for v in per),
            "distinct_results": len(distinct),
            "vs_deterministic_differing": max((v["differing"] for v in vd), default=0),
            "vs_deterministic_max_ulp": max((v["max_ulp"] for v in vd), default=0),
        }
    return {"runs": runs, "tensors": res}


def exit_status(report: Mapping[str, Any]) -> int:
    """0: every configuration that ran is reproducible (or an upstream-xfail); 1: any
    non-reproducible / guard / unwritten / error result; 5: nothing ran (all unsupported or
    not-run)."""
    st = [c["status"] for c in report["configs"]]
    if any(s in FAILING for s in st):
        return 1
    if not any(s in ("reproducible", "xfail", "xpass") for s in st):
        return 5
    return 0


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------

#: environment fields that make up the manifest's environment key
ENV_KEY_FIELDS = ("gpu", "compute_capability", "driver", "cuda", "torch", "fa4", "dsl", "backend",
                  "arch", "numpy", "mutations")


def environment_key(env: Mapping[str, str]) -> dict[str, str]:
    return {k: str(env[k]) for k in ENV_KEY_FIELDS if k in env}


def build_manifest(report: Mapping[str, Any], environment: Mapping[str, str], *,
                   provenance: Mapping[str, Any] | None = None) -> dict:
    """The digest manifest: environment key + per configuration (key = name, features, shape,
    dtype, seed) the digests of dQ, dK, dV, dsink of the deterministic backward -- only for
    configurations whose digests agreed across every run, process and device."""
    entries = {}
    for c in report["configs"]:
        if c["status"] not in ("reproducible", "xpass"):
            continue
        entries[c["key"]] = {"config": c["config"], "digests": c["digests"],
                             "shapes": c.get("shapes", {}),
                             "inputs_digest": c.get("inputs_digest"),
                             "fwd_digests": c.get("fwd_digests"),
                             "runs": c.get("total_runs"), "processes": len(c["processes"]),
                             "devices": c["devices"]}
    return {"schema": SCHEMA_MANIFEST, "environment": dict(environment),
            "environment_key": environment_key(environment),
            "provenance": dict(provenance or {}), "entries": entries}


def load_manifest(path: str) -> dict:
    """Read and check a manifest; ValueError with the reason if it is not one."""
    try:
        with open(path) as f:
            m = json.load(f)
    except OSError as ex:
        raise ValueError(f"cannot read manifest {path!r}: {ex.strerror}") from None
    except json.JSONDecodeError as ex:
        raise ValueError(f"manifest {path!r} is not JSON: {ex}") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA_MANIFEST:
        raise ValueError(f"{path!r} is not a determinism manifest (schema "
                         f"{m.get('schema') if isinstance(m, dict) else None!r}, expected "
                         f"{SCHEMA_MANIFEST!r})")
    if not isinstance(m.get("entries"), dict) or not isinstance(m.get("environment_key"), dict):
        raise ValueError(f"manifest {path!r} lacks 'entries' or 'environment_key'")
    return m


Outcome = Literal["match", "mismatch", "different-environment", "inputs-differ",
                  "only-current", "only-reference"]


def compare_manifests(current: Mapping[str, Any], reference: Mapping[str, Any], *,
                      strict_env: bool = False) -> dict:
    """Compare two manifests entry by entry.

    Per entry: ``match`` (every digest equal), ``mismatch`` (listing the tensors whose digests
    differ) when the environment keys are equal or ``strict_env``, ``different-environment`` when
    they differ (reported, not a failure), ``inputs-differ`` (the inputs' digests differ, so the
    outputs cannot be compared), ``only-current`` / ``only-reference``. The verdict is
    ``mismatch`` if any entry mismatches, else ``different-environment`` if any entry could only
    be compared across environments with differing results, else ``match``; ``failed`` is True
    for ``mismatch`` only.
    """
    ek_c, ek_r = current["environment_key"], reference["environment_key"]
    env_diff = {k: [ek_c.get(k), ek_r.get(k)] for k in sorted(set(ek_c) | set(ek_r))
                if ek_c.get(k) != ek_r.get(k)}
    same_env = not env_diff
    entries = []
    ce, re_ = current["entries"], reference["entries"]
    for key in sorted(set(ce) | set(re_)):
        if key not in re_:
            entries.append({"key": key, "outcome": "only-current"})
            continue
        if key not in ce:
            entries.append({"key": key, "outcome": "only-reference"})
            continue
        a, b = ce[key], re_[key]
        if a.get("inputs_digest") and b.get("inputs_digest") and \
                a["inputs_digest"] != b["inputs_digest"]:
            entries.append({"key": key, "outcome": "inputs-differ"})
            continue
        diff = sorted(t for t in set(a["digests"]) | set(b["digests"])
                      if a["digests"].get(t) != b["digests"].get(t))
        if not diff:
            entries.append({"key": key, "outcome": "match"})
        elif same_env or strict_env:
            entries.append({"key": key, "outcome": "mismatch", "tensors": diff})
        else:
            entries.append({"key": key, "outcome": "different-environment", "tensors": diff})
    outs = {e["outcome"] for e in entries}
    if "mismatch" in outs:
        verdict = "mismatch"
    elif "different-environment" in outs or (not same_env and "match" not in outs):
        verdict = "different-environment"
    elif "match" in outs:
        verdict = "match"
    else:
        verdict = "nothing-compared"
    return {"verdict": verdict, "failed": verdict == "mismatch",
            "same_environment": same_env, "environment_diff": env_diff,
            "strict_env": strict_env, "entries": entries,
            "counts": {o: sum(1 for e in entries if e["outcome"] == o) for o in sorted(outs)}}


def git_commit(path: str | None = None) -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=path or os.path.dirname(os.path.abspath(__file__)), timeout=10)
        out = r.stdout.strip()
        return out if r.returncode == 0 and len(out) == 40 and all(
            ch in "0123456789abcdef" for ch in out) else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
