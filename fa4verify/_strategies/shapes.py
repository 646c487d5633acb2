"""Shapes FA4 accepts: head dims per arch, tile-edge-biased sequence lengths, head counts.

Everything here is pure Python (no numpy arrays, no torch): the strategies draw small integers
that shrink toward the simplest valid shape (batch 1, one head, the smallest head dim, short
sequences).

Note [Tile edges]
    FA4 tiles the query axis in blocks of ``tile_m`` rows (128 on SM100; 128 or 192 on SM90) and
    the key axis in blocks of ``tile_n`` columns (128 on SM100; 80, 96, 112, 128 or 144 on SM90,
    depending on head dim, causal/local; fa4_numerics.md section 3). Accuracy bugs cluster where a
    sequence ends exactly at, one before, or one after a tile boundary (a tail tile with one
    column, a tail tile dropped, masking of the padded part), and at half-tile offsets
    (PyTorch #196678: NaN at seq_len % 128 == 64). :func:`seqlen_edges` lists those lengths and
    :func:`seqlens` draws them with high probability.
"""
from __future__ import annotations

from typing import Literal, Optional, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify.kernels import facts as _facts
from fa4verify.problem import head_dims_supported

Arch = Literal["sm90", "sm100"]
DType = Literal["bf16", "fp16"]

#: Architectures the strategies know. "sm90" is Hopper (H100/H200, the production target here);
#: "sm100" is Blackwell (B200), checked on the CPU twin only.
ARCHS: tuple[str, ...] = _facts.ARCHS   # sm103: the SM100 kernels, sm103 tuning rows (one vocabulary)
#: Input dtypes. fp8 (SM100 forward only) is deliberately not generated: it has no backward and
#: needs descale tensors, which the properties here do not model.
DTYPES: tuple[str, ...] = ("bf16", "fp16")

#: KV tile widths FA4 uses (SM100: 128, or 64 for some split-KV cases; SM90: fa4_numerics.md
#: section 3), and the query tile heights (128 and 192). Used for the edge list only.
TILE_SIZES: tuple[int, ...] = (64, 80, 96, 112, 128, 144, 192)

#: Largest head dim FA4 has on each arch (the MLA (64|512, 512) shapes are never generated).
_SM90_HEAD_DIMS = tuple(range(8, 257, 8))
_SM100_STANDARD = tuple(range(8, 129, 8))


def check_arch(arch: str) -> None:
    """Raise :class:`InvalidArgument` unless ``arch`` is one of :data:`ARCHS`."""
    if arch not in ARCHS:
        raise InvalidArgument(f"arch={arch!r} is not supported; expected one of {ARCHS}")


def check_dtype(dtype: str) -> None:
    """Raise :class:`InvalidArgument` unless ``dtype`` is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype={dtype!r} is not supported; expected one of {DTYPES}")


def head_dim_supported(arch: str, head_dim: int, head_dim_v: int) -> bool:
    """FA4's own head-dim rule (``flash_attn/cute/interface.py:_validate_head_dims``), 16-bit inputs.

    * SM90: ``8 <= head_dim, head_dim_v <= 256``, both multiples of 8 (16-byte alignment).
    * SM100: both in 8..128 and multiples of 8; or (192, 128); or (256, 256). The MLA shapes
      (64 or d, 512) are valid in FA4 but outside this toolkit's scope and return False here.
    """
    check_arch(arch)
    return head_dims_supported(arch, head_dim, head_dim_v)   # the problem type's rule, 16-bit


def check_head_dims(arch: str, head_dim: int, head_dim_v: int) -> None:
    """Raise :class:`InvalidArgument` naming the values when FA4 rejects ``(head_dim, head_dim_v)``."""
    if not head_dim_supported(arch, head_dim, head_dim_v):
        raise InvalidArgument(
            f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on {arch}: "
            + ("both must be multiples of 8 in 8..256" if arch == "sm90" else
               "both must be multiples of 8 in 8..128, or (192, 128), or (256, 256)"))


def supported_head_dims(arch: str, *, max_head_dim: int = 256) -> tuple[tuple[int, int], ...]:
    """All ``(head_dim, head_dim_v)`` pairs generated for ``arch`` with ``head_dim <= max_head_dim``.

    Ordered so that shrinking goes toward small, equal head dims: equal pairs in ascending order
    first, then the unequal pairs FA4's tests use ((128, 64) on SM90/SM100 and (192, 128)).
    """
    check_arch(arch)
    if max_head_dim < 8:
        raise InvalidArgument(f"max_head_dim={max_head_dim} must be >= 8")
    if arch == "sm90":
        equal = [(d, d) for d in _SM90_HEAD_DIMS]
        unequal = [(128, 64), (192, 128), (64, 128)]
    else:
        equal = [(d, d) for d in _SM100_STANDARD] + [(256, 256)]
        unequal = [(128, 64), (192, 128), (64, 128)]
    pairs = [p for p in equal + unequal if p[0] <= max_head_dim and p[1] <= max_head_dim]
    assert all(head_dim_supported(arch, *p) for p in pairs)
    return tuple(pairs)


def seqlen_edges(max_seqlen: int, *, min_seqlen: int = 1) -> tuple[int, ...]:
    """Tile-edge sequence lengths in ``[min_seqlen, max_seqlen]``, ascending (Note [Tile edges]).

    Contains 1, 2, 3; ``m - 1, m, m + 1`` for every multiple ``m`` of each tile size in
    :data:`TILE_SIZES`; ``m + 64`` for multiples of 128 (the half-tile case); and ``2^k - 1, 2^k,
    2^k + 1``.
    """
    if max_seqlen < min_seqlen:
        raise InvalidArgument(f"max_seqlen={max_seqlen} < min_seqlen={min_seqlen}")
    out = {1, 2, 3}
    for t in TILE_SIZES:
        for m in range(t, max_seqlen + 2, t):
            out.update((m - 1, m, m + 1))
    for m in range(128, max_seqlen + 1, 128):
        out.update((m + 63, m + 64, m + 65))
    k = 1
    while (1 << k) <= max_seqlen + 1:
        out.update(((1 << k) - 1, 1 << k, (1 << k) + 1))
        k += 1
    return tuple(sorted(x for x in out if min_seqlen <= x <= max_seqlen))


def seqlens(*, max_seqlen: int, min_seqlen: int = 1) -> st.SearchStrategy[int]:
    """Sequence lengths in ``[min_seqlen, max_seqlen]`` (inclusive), biased to tile edges.

    About 3/4 of draws come from :func:`seqlen_edges`; the rest are uniform integers. Shrinks
    toward ``min_seqlen``. ``min_seqlen`` may be 0 (only varlen sequences may be empty).
    """
    if min_seqlen < 0:
        raise InvalidArgument(f"min_seqlen={min_seqlen} must be >= 0")
    edges = seqlen_edges(max_seqlen, min_seqlen=max(min_seqlen, 1))
    if min_seqlen == 0:
        edges = (0,) + edges
    if not edges:  # a narrow range with no tile edge in it, e.g. [201, 210]
        return st.integers(min_seqlen, max_seqlen)
    return st.one_of(st.sampled_from(edges), st.sampled_from(edges), st.sampled_from(edges),
                     st.integers(min_seqlen, max_seqlen))


@st.composite
def seqlen_pairs(draw: DrawFn, *, max_seqlen: int, min_seqlen: int = 1, max_seqlen_k: Optional[int] = None,
                 min_seqlen_k: Optional[int] = None) -> tuple[int, int]:
    """``(seqlen_q, seqlen_k)``, each from :func:`seqlens`; equal, q < k and q > k all occur.

    ``seqlen_q`` lies in ``[min_seqlen, max_seqlen]`` and ``seqlen_k`` in ``[min_seqlen_k,
    max_seqlen_k]`` (default: the same range). The relation is drawn first, so ``seqlen_q !=
    seqlen_k`` is tried in both directions (where the ranges allow it). "free" (independent
    lengths) comes first so that the shrinker can reduce each length on its own (e.g. to
    ``(1, 129)`` when only the key length matters). Shrinks toward ``(min_seqlen, min_seqlen_k)``.
    """
    kmax = max_seqlen if max_seqlen_k is None else max_seqlen_k
    kmin = min_seqlen if min_seqlen_k is None else min_seqlen_k
    relation = draw(st.sampled_from(("free", "equal", "q_shorter", "k_shorter")))
    sq = draw(seqlens(max_seqlen=max_seqlen, min_seqlen=min_seqlen))
    if relation == "equal" and kmin <= sq <= kmax:
        return sq, sq
    if relation == "q_shorter" and max(sq + 1, kmin) <= kmax:
        return sq, draw(seqlens(max_seqlen=kmax, min_seqlen=max(sq + 1, kmin)))
    if relation == "k_shorter" and kmin <= min(sq - 1, kmax):
        return sq, draw(seqlens(max_seqlen=min(sq - 1, kmax), min_seqlen=kmin))
    return sq, draw(seqlens(max_seqlen=kmax, min_seqlen=kmin))


def head_dims(*, arch: str, max_head_dim: int = 256,
              choices: "Sequence[int | Sequence[int]] | None" = None) -> st.SearchStrategy[tuple[int, int]]:
    """``(head_dim, head_dim_v)`` pairs FA4 accepts on ``arch`` (:func:`supported_head_dims`).

    Half of the draws come from the values FA4's own tests use (64, 96, 128, 192, 256 and the
    small 8/16/32) when they fit; shrinks toward ``(8, 8)``. ``choices`` restricts the draw to
    these head dims: an int ``d`` is ``(d, d)``, a pair is ``(head_dim, head_dim_v)`` (e.g. a
    deployment's, or a palette that bounds the number of kernels a GPU campaign compiles); a
    value FA4 rejects on ``arch`` raises :class:`InvalidArgument`.
    """
    pairs = supported_head_dims(arch, max_head_dim=max_head_dim)
    if choices is not None:
        want = {(int(c), int(c)) if isinstance(c, int) else (int(c[0]), int(c[1])) for c in choices}
        for d, dv in want:
            check_head_dims(arch, d, dv)
        pairs = tuple(sorted(want, key=lambda p: (p[0] != p[1], p)))
        if not pairs:
            raise InvalidArgument("head-dim choices must not be empty")
    favoured = tuple(p for p in pairs if p[0] in (8, 16, 32, 64, 96, 128, 192, 256))
    return st.one_of(st.sampled_from(pairs), st.sampled_from(favoured or pairs))


@st.composite
def head_counts(draw: DrawFn, *, max_heads: int = 4, gqa: bool = True) -> tuple[int, int]:
    """``(nheads, nheads_kv)`` with ``1 <= nheads_kv <= nheads <= max_heads`` and
    ``nheads % nheads_kv == 0`` (MHA, GQA and MQA). With ``gqa=False``, ``nheads_kv == nheads``.
    Shrinks toward ``(1, 1)``."""
    if max_heads < 1:
        raise InvalidArgument(f"max_heads={max_heads} must be >= 1")
    nheads = draw(st.integers(1, max_heads))
    if not gqa:
        return nheads, nheads
    divisors = [d for d in range(nheads, 0, -1) if nheads % d == 0]
    return nheads, draw(st.sampled_from(divisors))
