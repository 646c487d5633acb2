"""FA4 attention semantics shared by every oracle: input validation, masks, head mapping, varlen.

Both oracles (``oracles.arbiter`` in mpmath, ``oracles.reference`` in certified float64) call
:func:`parse_problem` and then evaluate the *same* mathematical function, so any difference between
them is arithmetic, never semantics.

The mathematical function (FA4 ``flash_attn.cute``, flash-attn-4 4.0.0b36)
--------------------------------------------------------------------------
Layout is FA4's: ``q`` (batch, seqlen_q, nheads, headdim), ``k`` (batch, seqlen_k, nheads_kv,
headdim), ``v`` (batch, seqlen_k, nheads_kv, headdim_v); varlen: (total_tokens, nheads, headdim)
plus ``cu_seqlens`` (batch+1,) int offsets. For one sequence, query row ``i`` (0-based, local to the
sequence), query head ``h`` and key ``j``::

    kv head        hk = h // (nheads // nheads_kv)                  (GQA/MQA, interface.py)
    logit          x_ij = softmax_scale * (q_i . k_j)               (scale default 1/sqrt(headdim),
                                                                     the float64 value
                                                                     ``1.0 / math.sqrt(headdim)``
                                                                     exactly as interface.py makes it)
    softcap        y_ij = softcap * tanh(x_ij / softcap)   if softcap > 0, else y_ij = x_ij
    mask           key j is visible iff  j <= i + (sk - sq) + right   (if right is not None)
                                    and  j >= i + (sk - sq) - left    (if left is not None)
    LSE            lse_i = log( sum_visible exp(y_ij) + exp(sink_h) )   (natural log; no sink term
                                                                          when learnable_sink is None)
    output         O_i = sum_visible exp(y_ij - lse_i) * v_j

The mask is bottom-right aligned (``fc/mask.py``: ``causal_row_offset = seqlen_k - n_block*tile_n -
seqlen_q``; ``col_limit_right = row + causal_row_offset + 1 + window_right``; ``col_limit_left = row
+ causal_row_offset - window_left``), identical to ``flash_attn.cute.testing.construct_local_mask``.
``window_size`` is resolved exactly like ``interface._resolve_causal_local_window``: both sides
negative -> both None (unbounded), ``causal=True`` sets ``right = 0`` (keeping ``left``), and
``(None, 0)`` is causal. A row with no visible key and no sink is *fully masked*: O = 0,
LSE = -inf, zero gradients. With a sink such a row has LSE = sink and O = 0 (FA4 fwd sm100
``:2709-2742``). ``seqlen_q > seqlen_k`` with causal is valid and gives fully masked top rows.
The sink is in logit units (compared with ``y``, not with ``q.k``) and enters the denominator only.

Note [A sink of -inf]: a sink of ``-inf`` is a value, not a non-finite input: ``exp(-inf) = 0``,
so the head's O and LSE are those without a sink (a fully masked row: O = 0, LSE = -inf = the
sink), and its gradient is the limit of a finite sink's: ``P_sink`` is 0 on a row with a visible
key and 1 on a fully masked one (which the sink alone fills, LSE = sink), so ``dsink_h = -sum
over the fully masked rows of D'_i`` (``D_i = 0`` there: the sum of their dLSE). FA4 itself
gives padded Q heads a sink of -inf (``softmax.load_learnable_sink``), and its backward takes
``P_sink = 1`` where ``LSE = -inf`` (``flash_bwd_postprocess.dsink_row_term``). A sink of
``+inf`` or NaN is non-finite input (below).

Non-finite inputs (Note [Oracle NaN policy])
--------------------------------------------
Attention is not defined for NaN/Inf inputs. Every output element whose value depends on a
non-finite input value (through its own query row, any *visible* key/value row, the sink of its
head, or in backward ``dout``/``out``/``dlse`` of a row that reaches it) is returned as NaN with
bound +inf. Values of masked keys never matter (exact semantics; FA4 itself may differ there,
because the kernel multiplies masked P = 0 with the loaded V tile and 0 * NaN = NaN).
Non-finite ``softmax_scale`` or ``softcap`` is a ValueError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = [
    "Segment", "Problem", "as_float64", "resolve_window", "visible_mask", "visible_key_range", "parse_problem",
    "check_like", "nonfinite_rows", "MANTISSA_BITS",
]

#: significand bits (including the implicit bit) of each accepted input dtype
MANTISSA_BITS: dict[str, int] = {"float8_e4m3fn": 4, "float8_e5m2": 3, "bfloat16": 8, "float16": 11,
                                 "float32": 24, "float64": 53}

_TORCH_DTYPES = {
    "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2",
    "torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32",
    "torch.float64": "float64",
}


def as_float64(x: Any, name: str) -> tuple[np.ndarray, str]:
    """Exact float64 copy of a torch tensor or numpy array, and the source dtype name.

    Accepted dtypes: float8_e4m3fn, float8_e5m2, bfloat16 (torch or ml_dtypes), float16, float32,
    float64. Every such value is exactly representable in float64, so the copy is exact. Raises
    ValueError naming ``name`` for any other dtype (integers, complex, other fp8 variants).
    (FA4's fp8 forward also takes per-(batch, head) descale factors; pass the descaled values,
    e.g. as float32, to the oracle.)
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        dt = _TORCH_DTYPES.get(str(x.dtype))
        if dt is None:
            raise ValueError(f"{name}: dtype {x.dtype} not supported (float8_e4m3fn, float8_e5m2, bfloat16, float16, float32, float64)")
        import torch  # noqa: PLC0415  (torch is optional; only imported when given a tensor)
        arr = x.detach().to(device="cpu", dtype=torch.float64).numpy().copy()
        return arr, dt
    arr = np.asarray(x)
    dt = str(arr.dtype)
    if dt not in MANTISSA_BITS:
        raise ValueError(f"{name}: dtype {arr.dtype} not supported (float8_e4m3fn, float8_e5m2, bfloat16, float16, float32, float64)")
    return arr.astype(np.float64), dt


def _as_int_vector(x: Any, name: str) -> np.ndarray:
    mod = type(x).__module__
    if mod.startswith("torch"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: must be a 1-D integer tensor, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64)


def resolve_window(causal: bool, window_size: Sequence[Optional[int]]) -> tuple[Optional[int], Optional[int]]:
    """Canonical ``(left, right)`` window, None = unbounded, as FA4's ``_resolve_causal_local_window``.

    Both negative -> (None, None); ``causal`` sets right = 0 and keeps left.
    """
    if len(window_size) != 2:
        raise ValueError(f"window_size: must be a pair (left, right), got {window_size!r}")
    left, right = window_size
    for side, val in (("left", left), ("right", right)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, np.integer))):
            raise ValueError(f"window_size: {side} must be an int or None, got {val!r}")
    left = None if left is None else int(left)
    right = None if right is None else int(right)
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    if causal:
        right = 0
    return left, right


def visible_mask(seqlen_q: int, seqlen_k: int, left: Optional[int], right: Optional[int],
                 rows: Optional[tuple[int, int]] = None,
                 cols: Optional[tuple[int, int]] = None) -> Optional[np.ndarray]:
    """Bool (seqlen_q, seqlen_k), True where key j is visible to query row i; None = all visible.

    ``rows=(r0, r1)`` / ``cols=(c0, c1)`` restrict to a sub-block (indices stay global).
    """
    if left is None and right is None:
        return None
    r0, r1 = rows if rows is not None else (0, seqlen_q)
    c0, c1 = cols if cols is not None else (0, seqlen_k)
    i = np.arange(r0, r1, dtype=np.int64)[:, None]
    j = np.arange(c0, c1, dtype=np.int64)[None, :]
    off = seqlen_k - seqlen_q
    ok = np.ones((r1 - r0, c1 - c0), dtype=bool)
    if right is not None:
        ok &= j <= i + off + right
    if left is not None:
        ok &= j >= i + off - left
    return ok


def visible_key_range(seqlen_q: int, seqlen_k: int, left: Optional[int], right: Optional[int],
                      r0: int, r1: int) -> tuple[int, int]:
    """Half-open key range ``[c0, c1)`` covering every key visible to some row in ``[r0, r1)``
    (empty when ``c0 >= c1``)."""
    off = seqlen_k - seqlen_q
    c1 = seqlen_k if right is None else min(seqlen_k, r1 - 1 + off + right + 1)
    c0 = 0 if left is None else max(0, r0 + off - left)
    return c0, max(c0, c1)


@dataclass(frozen=True)
class Segment:
    """One sequence: query tokens ``[q_start, q_start+q_len)`` and keys ``[k_start, k_start+k_len)``
    of the flattened token axis."""

    q_start: int
    q_len: int
    k_start: int
    k_len: int


@dataclass
class Problem:
    """A validated problem, flattened to token-major float64 arrays.

    ``q`` (Tq, H, D), ``k`` (Tk, Hk, D), ``v`` (Tk, Hk, Dv), exact copies of the inputs.
    ``out_shape`` is the shape of ``out``; ``lse_varlen`` says whether LSE is (H, total_q)
    (varlen q) or (batch, H, seqlen_q).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    segments: list[Segment]
    scale: float
    softcap: float
    sink: Optional[np.ndarray]
    left: Optional[int]
    right: Optional[int]
    nheads: int
    nheads_kv: int
    dtypes: dict[str, str]
    out_shape: tuple[int, ...]
    lse_varlen: bool
    batch: int
    seqlen_q: int  # batched q only (else 0)
    k_shape: tuple[int, ...] = ()
    v_shape: tuple[int, ...] = ()

    @property
    def group(self) -> int:
        return self.nheads // self.nheads_kv

    @property
    def headdim(self) -> int:
        return self.q.shape[2]

    @property
    def headdim_v(self) -> int:
        return self.v.shape[2]

    def mask(self, seg: Segment) -> Optional[np.ndarray]:
        return visible_mask(seg.q_len, seg.k_len, self.left, self.right)

    def lse_from_flat(self, flat: np.ndarray) -> np.ndarray:
        """(H, Tq) -> FA4 LSE layout."""
        if self.lse_varlen:
            return flat
        return flat.reshape(self.nheads, self.batch, self.seqlen_q).transpose(1, 0, 2).copy()

    def lse_to_flat(self, lse: np.ndarray) -> np.ndarray:
        """FA4 LSE layout -> (H, Tq)."""
        if self.lse_varlen:
            return lse
        return lse.transpose(1, 0, 2).reshape(self.nheads, -1)

    def out_from_flat(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(self.out_shape)

    def lse_shape(self) -> tuple[int, ...]:
        if self.lse_varlen:
            return (self.nheads, self.q.shape[0])
        return (self.batch, self.nheads, self.seqlen_q)


def _check_cu(cu: np.ndarray, name: str, total: int) -> None:
    if cu.size < 1:
        raise ValueError(f"{name}: needs at least one entry, got shape {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {cu[0]}")
    if np.any(np.diff(cu) < 0):
        raise ValueError(f"{name}: must be non-decreasing, got {cu.tolist()}")
    if cu[-1] != total:
        raise ValueError(f"{name}: last entry {cu[-1]} must equal the token count {total}")


def parse_problem(
    q: Any, k: Any, v: Any, *, softmax_scale: Optional[float], causal: bool,
    window_size: Sequence[Optional[int]], softcap: float, learnable_sink: Any,
    cu_seqlens_q: Any, cu_seqlens_k: Any,
) -> Problem:
    """Validate FA4-style arguments and build a :class:`Problem`.

    Raises ValueError naming the argument and the offending values for: wrong rank, batch or
    seqlen mismatch between k and v, headdim mismatch between q and k, nheads_kv mismatch
    between k and v, nheads not divisible by nheads_kv, mixed q/k/v dtypes, unsupported dtypes,
    bad cu_seqlens (not 1-D int, not starting at 0, decreasing, wrong total, different lengths
    for q and k), bad learnable_sink shape, non-finite or negative softcap, non-finite scale.
    """
    qa, qdt = as_float64(q, "q")
    ka, kdt = as_float64(k, "k")
    va, vdt = as_float64(v, "v")
    if not (qdt == kdt == vdt):
        raise ValueError(f"q, k, v: dtypes must match, got q={qdt}, k={kdt}, v={vdt}")
    varlen_q = cu_seqlens_q is not None
    varlen_k = cu_seqlens_k is not None
    want_q = 3 if varlen_q else 4
    want_k = 3 if varlen_k else 4
    if qa.ndim != want_q:
        raise ValueError(f"q: expected {want_q}-D {'(total_q, nheads, headdim)' if varlen_q else '(batch, seqlen_q, nheads, headdim)'}, got shape {qa.shape}")
    for nm, arr in (("k", ka), ("v", va)):
        if arr.ndim != want_k:
            raise ValueError(f"{nm}: expected {want_k}-D {'(total_k, nheads_kv, headdim)' if varlen_k else '(batch, seqlen_k, nheads_kv, headdim)'}, got shape {arr.shape}")
    if ka.shape[:-1] != va.shape[:-1]:
        raise ValueError(f"k, v: leading dims (batch/seqlen/nheads_kv) must match, got k {ka.shape} v {va.shape}")
    nheads, d = qa.shape[-2:]
    nheads_kv, dk = ka.shape[-2:]
    if d != dk:
        raise ValueError(f"q, k: headdim must match, got q headdim {d} and k headdim {dk}")
    if nheads_kv < 1 or nheads < 1 or nheads % nheads_kv != 0:
        raise ValueError(f"q, k: nheads ({nheads}) must be a positive multiple of nheads_kv ({nheads_kv})")
    # batch structure
    if varlen_q:
        cuq = _as_int_vector(cu_seqlens_q, "cu_seqlens_q")
        _check_cu(cuq, "cu_seqlens_q", qa.shape[0])
        batch = cuq.size - 1
    if varlen_k:
        cuk = _as_int_vector(cu_seqlens_k, "cu_seqlens_k")
        _check_cu(cuk, "cu_seqlens_k", ka.shape[0])
        bk = cuk.size - 1
        if varlen_q and bk != batch:
            raise ValueError(f"cu_seqlens_q, cu_seqlens_k: lengths must match, got {cuq.size} and {cuk.size}")
        if not varlen_q:
            batch = qa.shape[0]
            if batch != bk:
                raise ValueError(f"q, cu_seqlens_k: batch {batch} != len(cu_seqlens_k)-1 = {bk}")
    if not varlen_q and not varlen_k:
        batch = qa.shape[0]
        if ka.shape[0] != batch:
            raise ValueError(f"q, k: batch must match, got q batch {batch} and k batch {ka.shape[0]}")
    if varlen_q and not varlen_k and ka.shape[0] != batch:
        raise ValueError(f"k, cu_seqlens_q: k batch {ka.shape[0]} != len(cu_seqlens_q)-1 = {batch}")
    segs = []
    for b in range(batch):
        if varlen_q:
            qs, ql = int(cuq[b]), int(cuq[b + 1] - cuq[b])
        else:
            qs, ql = b * qa.shape[1], qa.shape[1]
        if varlen_k:
            ks, kl = int(cuk[b]), int(cuk[b + 1] - cuk[b])
        else:
            ks, kl = b * ka.shape[1], ka.shape[1]
        segs.append(Segment(qs, ql, ks, kl))
    seqlen_q = 0 if varlen_q else qa.shape[1]
    out_shape = qa.shape[:-1] + (va.shape[-1],)
    qf = qa.reshape(-1, nheads, d)
    kf = ka.reshape(-1, nheads_kv, d)
    vf = va.reshape(-1, nheads_kv, va.shape[-1])
    # scalars
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = float(softmax_scale)
        if not math.isfinite(scale):
            raise ValueError(f"softmax_scale: must be finite, got {softmax_scale!r}")
    cap = 0.0 if softcap is None else float(softcap)
    if not math.isfinite(cap) or cap < 0:
        raise ValueError(f"softcap: must be finite and >= 0, got {softcap!r}")
    sink = None
    dts = {"q": qdt, "k": kdt, "v": vdt}
    if learnable_sink is not None:
        sink, sdt = as_float64(learnable_sink, "learnable_sink")
        if sink.shape != (nheads,):
            raise ValueError(f"learnable_sink: expected shape ({nheads},) (nheads), got {sink.shape}")
        dts["learnable_sink"] = sdt
    left, right = resolve_window(bool(causal), window_size)
    return Problem(q=qf, k=kf, v=vf, segments=segs, scale=scale, softcap=cap, sink=sink,
                   left=left, right=right, nheads=nheads, nheads_kv=nheads_kv, dtypes=dts,
                   out_shape=out_shape, lse_varlen=varlen_q, batch=batch, seqlen_q=seqlen_q,
                   k_shape=ka.shape, v_shape=va.shape)


def check_like(x: Any, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, str]:
    """Exact float64 copy of ``x`` with a shape check (ValueError naming ``name``)."""
    arr, dt = as_float64(x, name)
    if arr.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {arr.shape}")
    return arr, dt


def nonfinite_rows(x: np.ndarray) -> np.ndarray:
    """(T, H, D) -> bool (T, H): row contains a NaN or Inf."""
    return ~np.isfinite(x).all(axis=-1)
