"""Paired FA4 ``score_mod`` / ``mask_mod`` callables: each :class:`ModPair` holds the CuTe DSL
function FA4 runs and a float64 numpy reference of the same function, so the oracle applies
exactly the modification the kernel applies.

FA4's contract (flash-attn-4 4.0.0b36, read from the installed source):

* ``score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors) -> score`` gets the
  **scaled** score ``x = fl(S * softmax_scale)`` in natural-log units (``softmax.py:
  apply_score_mod_inner``: ``score_tensor[i] * softmax_scale``; ``utils.compute_softmax_scale_log2``
  keeps ``softmax_scale`` apart and uses ``log2(e)`` as the exp2 scale when a score_mod is set), as
  fp32 ``TensorSSA`` of ``vec_size`` elements (1 with aux tensors); indices are Int32 SSA.
  The softmax is over the returned ``y``; masking (``-inf``) comes after.
* ``score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors) -> grad * dy/dx``
  (``apply_score_mod_bwd_inner``: "dlogits rewritten in-place with d(scaled_scores)"; ``score`` is
  again the scaled pre-mod score). FA4's backward requires it whenever a score_mod is given
  (``interface.py``: "score_mod_bwd is required when score_mod is provided").
* ``mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors) -> Boolean`` (``mask.py:
  call_mask_mod``; True = attend; scalar SSA indices). With a mask_mod FA4 **drops causal and
  window** (``_resolve_causal_local_window`` returns ``causal=False, local=False``): a causal
  mask must be written into the mask_mod.
* ``aux_tensors``: torch tensors handed through to both; indices reaching them are wrapped
  modulo seqlen when FA4 also masks the sequence end.
* ``aux_scalars``: runtime scalars (``interface.py``: "Runtime scalar captures used by score_mod
  or mask_mod"), passed to the mods as the keyword ``aux_scalars`` only when the call gives them
  (``softmax.call_score_mod``, ``mask.call_mask_mod``: the "compatibility shim for pre-aux_scalars
  callables"); FA4 keys its kernels on their *types* only (``aux_scalar_metadata``), so the values
  must reach the kernel as launch parameters (Note [Runtime scalars] in
  ``fa4verify/compile/census_aux.py``). FA4 4.0.0b36 + DSL 4.8.1 compile them as
  ``cutlass.Float32`` (a Python float does not compile there): the adapter converts.

References take numpy arrays broadcast to one (batch entry, head) block: ``b``, ``h`` ints,
``q_idx`` (lq, 1), ``kv_idx`` (1, lk), ``scores`` (lq, lk) float64, ``aux`` the list of numpy
aux arrays (:class:`AuxValues`: its ``scalars`` are the call's aux scalars, its ``constants`` the
compile-time constants of a pair family, both fp32 values). CuTe functions are built lazily
(:meth:`ModPair.cute`), ``None`` without the DSL.

* Compile-time constants: a factory that builds its mod with ``def score_mod(..., c=c)`` bakes
  ``c`` into the kernel; FA4's ``utils._compute_base_hash`` hashes ``__defaults__`` /
  ``__kwdefaults__`` ("Factory-generated score/mask modifiers often capture specialization values
  as defaults"), so two such mods that differ only in ``c`` must compile apart. A pair with
  ``constants`` (:func:`default_slope`) is that factory: one CuTe function per constant value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np

__all__ = ["ModShape", "ModPair", "AuxValues", "alibi", "scalar_bias", "default_slope", "rel_bias", "rel_scale", "softcap_mod",
           "document_mask", "prefix_lm", "head_window",
           "sliding_window", "causal_mask", "checkerboard", "seqlen_bias", "causal_aligned", "head_scale",
           "batch_length_scale", "library", "U32"]

U32 = 2.0 ** -24
#: PTX ``tanh.approx.f32`` maximum relative error (error_budgets/DERIVATIONS.md#m-constants)
TANH_REL = 2.0 ** -10.987


@dataclass(frozen=True)
class ModShape:
    """What an aux-tensor factory needs to know about the problem."""
    batch: int
    nheads: int
    seqlen_q: int
    seqlen_k: int


class AuxValues(list):
    """A pair's aux data as its references read it: the list of aux arrays (``aux_tensors``, as
    numpy) with ``scalars``, the call's ``aux_scalars`` as Python floats holding fp32 values
    (what the kernel receives), ``constants``, the compile-time constants the call's CuTe
    function bakes in (fp32 values); () when the pair takes none; and ``seqlens``, per batch
    entry (varlen: per sequence) the ``(seqlen_q, seqlen_k)`` FA4 hands the mods as
    ``seqlen_info.seqlen_q`` / ``seqlen_info.seqlen_k`` (Note [Lengths the mods see])."""

    def __init__(self, arrays=(), scalars=(), constants=(), seqlens=()) -> None:
        super().__init__(arrays)
        self.scalars: tuple[float, ...] = _fp32(scalars)
        self.constants: tuple[float, ...] = _fp32(constants)
        self.seqlens: tuple[tuple[int, int], ...] = tuple((int(q), int(k)) for q, k in seqlens)


def _fp32(values) -> tuple[float, ...]:
    """``values`` rounded to fp32, as Python floats (what FA4's ``cutlass.Float32`` scalars hold)."""
    return tuple(float(np.float32(x)) for x in values)


@dataclass(frozen=True, eq=False)
class ModPair:
    """One FA4 modification and its float64 reference.

    * ``name``: registry key (``[a-z0-9_]+``).
    * ``kind``: "score" (``ref`` returns the modified score ``y``, ``grad`` returns ``dy/dx``,
      ``err`` an upper bound, natural-log units, on ``|y_kernel - y(x)|`` for the fp32 ``x`` the
      kernel holds: the mod's own fp32 evaluation, not the rounding of ``x``) or "mask" (``ref``
      returns the boolean keep-mask, True = attend; it may depend on the head only when
      ``by_head``).
    * ``build``: ``() -> (cute_fn, cute_bwd_fn_or_None)``, imported and traced only when called.
    * ``aux``: ``(ModShape, numpy Generator) -> [numpy arrays]`` (float32 / int32; handed to FA4
      as CUDA tensors and to ``ref`` as numpy), or None. The CuTe function reads them from
      ``aux_tensors[0]`` on: two pairs with aux tensors cannot share one FA4 call.
    * ``scalars``: ``numpy Generator -> [floats]``, the runtime ``aux_scalars`` (rounded to fp32;
      handed to FA4 as ``cutlass.Float32`` and to ``ref`` as ``aux.scalars``), or None. Drawn at
      the problem's ``mod_seed``: two calls that differ only there share FA4's kernel (its key
      holds the scalars' types) and must each compute with their own values.
    * ``constants``: ``numpy Generator -> [floats]``, compile-time constants (rounded to fp32)
      drawn at the problem's ``mod_seed``, handed to ``build(*constants)`` -- whose CuTe
      functions bake them in as default arguments -- and to ``ref`` as ``aux.constants``; or
      None. Two calls that differ only there hand FA4 two functions that differ only in
      ``__defaults__``: FA4's key must tell them apart.
    * ``lipschitz``: ``sup |dy/dx|``; the composed budgets assume <= 1 (the judge reports a pair
      above it undecided: error_budgets/DERIVATIONS.md#score-mod).
    * ``equivalent``: the FA4 built-in this pair equals, computed with the built-in's own
      operations, e.g. ``{"softcap": 30.0}``, ``{"window_size": (l, r)}``, ``{"causal": True}``
      (the GPU script compares them; the judge bounds a softcap pair's gradients with the
      built-in softcap's model: Note [A softcap pair in the built-in's model]).
    * ``features``: FA4 features the call needs ("score_mod", "score_mod_bwd", "mask_mod",
      "aux_tensors", "aux_scalars").
    """

    name: str
    kind: Literal["score", "mask"]
    ref: Callable[..., np.ndarray]
    build: Optional[Callable[[], tuple]] = None
    grad: Optional[Callable[..., np.ndarray]] = None
    err: Optional[Callable[..., np.ndarray]] = None
    aux: Optional[Callable[[ModShape, np.random.Generator], list]] = None
    scalars: Optional[Callable[[np.random.Generator], Sequence[float]]] = None
    constants: Optional[Callable[[np.random.Generator], Sequence[float]]] = None
    lipschitz: float = 1.0
    curvature: float = 0.0                 #: sup |d^2 y / dx^2| (the oracle's bound on grad)
    equivalent: dict = field(default_factory=dict)
    features: tuple = ()
    description: str = ""
    self_attention_only: bool = False      #: needs seqlen_q == seqlen_k (indices shared)
    #: a mask pair whose keep-mask depends on the query head: the judge then builds one keep-mask
    #: per (batch entry, head) (Note [Masks by head] in fa4verify/problem/__init__.py)
    by_head: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cache", {})

    # -- CuTe side (lazy)
    def _built(self, constants: Sequence[float] = ()):
        c = self._cache           # type: ignore[attr-defined]
        key = ("fns", tuple(constants))
        if key not in c:
            if self.build is None:
                c[key] = (None, None)
            else:
                try:
                    import cutlass.cute  # noqa: F401
                except Exception:          # no CUTLASS DSL: the references still work
                    c[key] = (None, None)
                else:
                    # one function object per constant value: FA4 hashes it once (``__cute_hash__``)
                    c[key] = tuple(self.build(*constants) if self.constants is not None else self.build())
        return c[key]

    def _constants_or_default(self, constants: Optional[Sequence[float]]) -> tuple[float, ...]:
        return tuple(constants) if constants is not None else self.make_constants(0)

    def cute(self, constants: Optional[Sequence[float]] = None):
        """The CuTe DSL ``score_mod`` / ``mask_mod`` (None without nvidia-cutlass-dsl), built with
        ``constants`` (a pair with :attr:`constants`; default: those at seed 0)."""
        return self._built(self._constants_or_default(constants))[0]

    def cute_bwd(self, constants: Optional[Sequence[float]] = None):
        """The CuTe DSL ``score_mod_bwd`` (score pairs; None for masks or without the DSL)."""
        return self._built(self._constants_or_default(constants))[1]

    # -- data side
    def make_aux(self, shape: ModShape, seed: int = 0,
                 seqlens: Optional[Sequence[tuple[int, int]]] = None) -> AuxValues:
        """The pair's aux data for ``shape`` at ``seed``; ``seqlens``: the lengths FA4 hands the
        mods per batch entry (default: ``shape``'s, the same for every entry)."""
        arrays = [] if self.aux is None else [np.ascontiguousarray(x)
                                              for x in self.aux(shape, np.random.default_rng(seed))]
        if seqlens is None:
            seqlens = [(shape.seqlen_q, shape.seqlen_k)] * shape.batch
        return AuxValues(arrays, self.make_scalars(seed), self.make_constants(seed), seqlens)

    def make_scalars(self, seed: int = 0) -> tuple[float, ...]:
        """The runtime aux scalars at ``seed`` (fp32 values; () for a pair without)."""
        if self.scalars is None:
            return ()
        return _fp32(self.scalars(np.random.default_rng([int(seed), 1])))

    def make_constants(self, seed: int = 0) -> tuple[float, ...]:
        """The compile-time constants at ``seed`` (fp32 values; () for a pair without)."""
        if self.constants is None:
            return ()
        return _fp32(self.constants(np.random.default_rng([int(seed), 2])))

    def kw_fa4(self, aux_torch=None, aux_scalars: Sequence[float] = (),
               constants: Optional[Sequence[float]] = None) -> dict[str, Any]:
        """Keyword arguments for ``fa4verify.kernels.adapter.forward`` / ``backward``
        (``aux_scalars``: the call's, :meth:`make_scalars`; ``constants``: the call's,
        :meth:`make_constants`)."""
        kw: dict[str, Any] = {}
        if self.kind == "score":
            kw["score_mod"] = self.cute(constants)
            kw["score_mod_bwd"] = self.cute_bwd(constants)
        else:
            kw["mask_mod"] = self.cute(constants)
        if aux_torch:
            kw["aux_tensors"] = list(aux_torch)
        if aux_scalars:
            kw["aux_scalars"] = tuple(aux_scalars)
        return kw

    def apply(self, scores, b: int, h: int, q_idx, kv_idx, aux):
        """Score pairs: ``y``; mask pairs: ``scores`` with ``-inf`` where not kept (float64)."""
        s = np.asarray(scores, np.float64)
        if self.kind == "score":
            return np.broadcast_to(np.asarray(self.ref(s, b, h, q_idx, kv_idx, aux), np.float64), s.shape)
        keep = np.broadcast_to(np.asarray(self.ref(b, h, q_idx, kv_idx, aux), bool), s.shape)
        return np.where(keep, s, -np.inf)


def _ssa(a, dtype):
    """A scalar as a shape-(1,) TensorSSA (inside ``@cute.jit`` code; the idiom of FA4's
    ``utils.scalar_to_ssa``, written here so this module does not import flash_attn)."""
    import cutlass.cute as cute
    vec = cute.make_rmem_tensor(1, dtype)
    vec[0] = a
    return vec.load()


def _absdiff(q_idx, kv_idx):
    return np.abs(np.asarray(q_idx, np.int64) - np.asarray(kv_idx, np.int64)).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# score mods
# ---------------------------------------------------------------------------------------------

def _identity_bwd():
    import cutlass.cute as cute

    @cute.jit
    def identity_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad
    return identity_bwd


def alibi() -> ModPair:
    """ALiBi: ``y = x - slope[h] * |q_idx - kv_idx|``, per-head slopes ``2^(-8 (h+1) / H)`` as
    an fp32 aux tensor (the reference reads the same fp32 slopes).

    Kernel error (fp32): ``|q - kv|`` converts exactly (< 2^24), ``slope * d`` and the subtraction
    round once each (or fuse into one FMA): ``err <= gamma(2) (|x| + |slope d|)``."""
    def aux(s: ModShape, rng):
        return [np.asarray([2.0 ** (-8.0 * (i + 1) / s.nheads) for i in range(s.nheads)], np.float32)]

    def ref(x, b, h, qi, ki, a):
        return x - float(a[0][h]) * _absdiff(qi, ki)

    def err(x, y, b, h, qi, ki, a):
        g2 = 2 * U32 / (1 - 2 * U32)
        return g2 * (np.abs(x) + float(a[0][h]) * _absdiff(qi, ki))

    def build():
        import cutlass
        import cutlass.cute as cute
        from cutlass._mlir.dialects import math as mlir_math

        @cute.jit
        def alibi_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            slopes = aux_tensors[0]
            slope = _ssa(slopes[h[0]], cutlass.Float32)
            diff = q_idx - kv_idx
            dist = cute.TensorSSA(mlir_math.absi(diff), diff.shape, diff.dtype).to(cutlass.Float32)
            return score - slope * dist
        return alibi_score, _identity_bwd()

    return ModPair("alibi", "score", ref, build, grad=lambda x, *r: np.ones_like(x), err=err, aux=aux,
                   features=("score_mod", "score_mod_bwd", "aux_tensors"),
                   description="ALiBi, per-head fp32 slopes 2^(-8(h+1)/H) in aux_tensors[0]")


REL_RADIUS = 64


def rel_bias(radius: int = REL_RADIUS) -> ModPair:
    """Relative-position bias table: ``y = x + table[clip(kv - q, -R, R) + R]``, an fp32 aux
    tensor of ``2R + 1`` entries (one rounding: ``err <= u (|x| + |t|)``)."""
    R = int(radius)

    def aux(s: ModShape, rng):
        return [(0.5 * rng.standard_normal(2 * R + 1)).astype(np.float32)]

    def idx(qi, ki):
        return np.clip(np.asarray(ki, np.int64) - np.asarray(qi, np.int64), -R, R) + R

    def ref(x, b, h, qi, ki, a):
        return x + np.asarray(a[0], np.float64)[idx(qi, ki)]

    def err(x, y, b, h, qi, ki, a):
        return U32 * (np.abs(x) + np.abs(np.asarray(a[0], np.float64)[idx(qi, ki)]))

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def rel_bias_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            table = aux_tensors[0]
            d = kv_idx - q_idx
            lo = cute.full_like(d, -R)
            hi = cute.full_like(d, R)
            d = cute.where(d < lo, lo, d)
            d = cute.where(d > hi, hi, d)
            i = d + cute.full_like(d, R)
            t = _ssa(table[i[0]], cutlass.Float32)
            return score + t
        return rel_bias_score, _identity_bwd()

    return ModPair("rel_bias", "score", ref, build, grad=lambda x, *r: np.ones_like(x), err=err, aux=aux,
                   features=("score_mod", "score_mod_bwd", "aux_tensors"),
                   description=f"relative-position bias table, clip(kv - q, -{R}, {R}), fp32 aux_tensors[0]")


SCALE_RADIUS = 32


def _pow2_product_err(x, y, b, h, qi, ki, a):
    """``err`` of a product by a power of two: exact in fp32 where ``|y| >= 2^-126``, a subnormal
    product possibly flushed (FTZ): ``2^-126`` (``f32_min_normal``)."""
    return np.full(np.shape(x), 2.0 ** -126)


def rel_scale(radius: int = SCALE_RADIUS) -> ModPair:
    """A relative-position temperature: ``y = x * t[clip(kv - q, -R, R) + R]``, an fp32 aux
    table of ``2R + 1`` powers of two (1/2 or 1, drawn; ``t[R + 1] = 1/2``, ``t[R - 1] = 1``: not
    symmetric in ``kv - q``). Its derivative ``t[...]`` reads the indices, so FA4's
    ``score_mod_bwd`` must see the same ``(q_idx, kv_idx)`` as the forward: the one built-in pair
    whose backward depends on them (the others' is the identity or index-free).

    Kernel error: a product by a power of two is exact in fp32 above the normal range's bottom;
    below it the product may be flushed (FTZ): ``err <= 2^-126`` (``f32_min_normal``, the floor
    the budgets give every fp32 operation), forward and ``grad * t`` alike."""
    R = int(radius)

    def aux(s: ModShape, rng):
        t = np.where(rng.random(2 * R + 1) < 0.5, 0.5, 1.0)
        t[R + 1], t[R - 1] = 0.5, 1.0
        return [t.astype(np.float32)]

    def idx(qi, ki):
        return np.clip(np.asarray(ki, np.int64) - np.asarray(qi, np.int64), -R, R) + R

    def ref(x, b, h, qi, ki, a):
        return x * np.asarray(a[0], np.float64)[idx(qi, ki)]

    def grad(x, b, h, qi, ki, a):
        return np.broadcast_to(np.asarray(a[0], np.float64)[idx(qi, ki)], np.shape(x))

    def build():
        import cutlass
        import cutlass.cute as cute

        # written out in both (no shared helper): FA4 keys its kernels on repr() of the closure's
        # values (utils._compute_base_hash), and a function's repr holds its address, so a
        # captured helper would make every process's key new (measured: 6 recompiles a warm audit)
        @cute.jit
        def rel_scale_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            table = aux_tensors[0]
            d = kv_idx - q_idx
            lo = cute.full_like(d, -R)
            hi = cute.full_like(d, R)
            d = cute.where(d < lo, lo, d)
            d = cute.where(d > hi, hi, d)
            i = d + cute.full_like(d, R)
            return score * _ssa(table[i[0]], cutlass.Float32)

        @cute.jit
        def rel_scale_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            table = aux_tensors[0]
            d = kv_idx - q_idx
            lo = cute.full_like(d, -R)
            hi = cute.full_like(d, R)
            d = cute.where(d < lo, lo, d)
            d = cute.where(d > hi, hi, d)
            i = d + cute.full_like(d, R)
            return grad * _ssa(table[i[0]], cutlass.Float32)
        return rel_scale_score, rel_scale_bwd

    return ModPair("rel_scale", "score", ref, build, grad=grad, err=_pow2_product_err, aux=aux, lipschitz=1.0, curvature=0.0,
                   features=("score_mod", "score_mod_bwd", "aux_tensors"),
                   description=f"relative-position temperature x * t[clip(kv - q, -{R}, {R})], t in {{1/2, 1}}, "
                               "fp32 aux_tensors[0] (its score_mod_bwd reads the indices)")


def scalar_bias() -> ModPair:
    """A bias set at run time: ``y = x + s0 - s1 * |q_idx - kv_idx|`` with ``(s0, s1) =
    aux_scalars`` (an ALiBi whose slope and offset are launch parameters, not compiled in):
    ``s0`` uniform in [-2, 2], ``s1`` in [0, 1/4], fp32, drawn at the problem's ``mod_seed``.

    Kernel error (fp32): ``|q - kv|`` converts exactly (< 2^24); ``s1 * d``, ``x + s0`` and the
    difference round once each (or fuse into FMAs, which round less): ``err <= gamma(3) (|x| +
    |s0| + s1 d)``."""
    def scalars(rng):
        return (rng.uniform(-2.0, 2.0), rng.uniform(0.0, 0.25))

    def ref(x, b, h, qi, ki, a):
        s0, s1 = a.scalars
        return x + s0 - s1 * _absdiff(qi, ki)

    def err(x, y, b, h, qi, ki, a):
        s0, s1 = a.scalars
        g3 = 3 * U32 / (1 - 3 * U32)
        return g3 * (np.abs(x) + abs(s0) + s1 * _absdiff(qi, ki))

    def build():
        import cutlass
        import cutlass.cute as cute
        from cutlass._mlir.dialects import math as mlir_math

        @cute.jit
        def scalar_bias_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars=None):
            diff = q_idx - kv_idx
            dist = cute.TensorSSA(mlir_math.absi(diff), diff.shape, diff.dtype).to(cutlass.Float32)
            return score + aux_scalars[0] - dist * aux_scalars[1]

        @cute.jit
        def scalar_bias_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars=None):
            return grad
        return scalar_bias_score, scalar_bias_bwd

    return ModPair("scalar_bias", "score", ref, build, grad=lambda x, *r: np.ones_like(x), err=err,
                   scalars=scalars, features=("score_mod", "score_mod_bwd", "aux_scalars"),
                   description="bias x + s0 - s1 |q - kv| with (s0, s1) FA4's runtime aux_scalars")


SLOPE_RANGE = (2.0 ** -6, 0.25)


def default_slope() -> ModPair:
    """A bias whose slope is compiled in as a default argument: ``y = x - c |q_idx - kv_idx|``,
    ``c`` uniform in :data:`SLOPE_RANGE` (fp32), drawn at the problem's ``mod_seed`` -- the
    factory idiom ``def score_mod(..., slope=c)`` that FA4's callable hash reads ``__defaults__``
    for. Two calls that differ only in ``c`` hand FA4 functions of equal source and no closure:
    only the defaults tell their kernels apart (the sequences machine varies ``c`` on one key:
    attribute ``mod_defaults``).

    Kernel error (fp32): ``|q - kv|`` converts exactly (< 2^24), ``c * d`` and the subtraction
    round once each (or fuse into one FMA): ``err <= gamma(2) (|x| + c d)``."""
    def constants(rng):
        return (rng.uniform(*SLOPE_RANGE),)

    def ref(x, b, h, qi, ki, a):
        return x - a.constants[0] * _absdiff(qi, ki)

    def err(x, y, b, h, qi, ki, a):
        g2 = 2 * U32 / (1 - 2 * U32)
        return g2 * (np.abs(x) + a.constants[0] * _absdiff(qi, ki))

    def build(c):
        import cutlass
        import cutlass.cute as cute
        from cutlass._mlir.dialects import math as mlir_math

        @cute.jit
        def default_slope_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, slope=c):
            diff = q_idx - kv_idx
            dist = cute.TensorSSA(mlir_math.absi(diff), diff.shape, diff.dtype).to(cutlass.Float32)
            return score - dist * slope
        return default_slope_score, _identity_bwd()

    return ModPair("default_slope", "score", ref, build, grad=lambda x, *r: np.ones_like(x), err=err,
                   constants=constants, features=("score_mod", "score_mod_bwd"),
                   description=(f"bias x - c |q - kv|, c in [{SLOPE_RANGE[0]:g}, {SLOPE_RANGE[1]:g}] compiled in "
                                "as the score_mod's default argument (drawn at mod_seed)"))


SOFTCAP = 30.0


def softcap_mod(cap: float = SOFTCAP) -> ModPair:
    """Softcap as a score_mod: ``y = cap * tanh(x / cap)``, ``dy/dx = 1 - tanh^2``, written with
    the operations of FA4's built-in (``utils.create_softcap_scoremod``: IEEE division,
    ``tanh(fastmath=True)`` = ``tanh.approx.f32``, one multiply), so the kernel FA4 builds for
    ``softcap=cap`` and for this pair is the same code: **expected bitwise equal** to the
    built-in (forward and backward), and within budget in any case.

    Kernel error: ``err <= (tanh_rel + gamma(2)) |y| + gamma(2) |x|`` (DERIVATIONS.md#softcap,
    the x rounding included there is counted separately here: it is below it)."""
    c = float(cap)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"softcap must be finite and > 0, got {cap}")

    def ref(x, *r):
        return c * np.tanh(x / c)

    def grad(x, *r):
        # sech^2 = 4 e^-2|a| / (1 + e^-2|a|)^2: no overflow of cosh at a huge |a|
        e2 = np.exp(-2.0 * np.abs(np.asarray(x, np.float64) / c))
        return 4.0 * e2 / (1.0 + e2) ** 2

    def err(x, y, *r):
        g2 = 2 * U32 / (1 - 2 * U32)
        return (TANH_REL + g2) * np.abs(y) + g2 * np.abs(x)

    def build():
        import cutlass.cute as cute

        @cute.jit
        def softcap_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            t = score / c
            return c * cute.math.tanh(t, fastmath=True)

        @cute.jit
        def softcap_score_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            t = cute.math.tanh(score / c, fastmath=True)
            return grad * (1.0 - t * t)
        return softcap_score, softcap_score_bwd

    # |d^2/dx^2 c tanh(x/c)| = 2 sech^2 tanh / c <= (4 / (3 sqrt 3)) / c < 1 / c
    return ModPair("softcap", "score", ref, build, grad=grad, err=err, curvature=1.0 / c, equivalent={"softcap": c},
                   features=("score_mod", "score_mod_bwd"),
                   description=f"softcap {c:g} * tanh(x / {c:g}) as a score_mod")


# ---------------------------------------------------------------------------------------------
# mask mods (exact: integer index arithmetic, so kernel and reference keep the same set)
# ---------------------------------------------------------------------------------------------

def document_mask(max_docs: int = 4) -> ModPair:
    """Document / segment mask: keep iff ``doc_q[b, q] == doc_k[b, kv]`` (aux int32 ``(batch,
    seqlen_q)`` and ``(batch, seqlen_k)`` of non-decreasing document ids). In self-attention
    (seqlen_q == seqlen_k) the two are equal; across lengths each document covers the same share of
    both sides (packed encoder-decoder or retrieval batches). The key ids are read at key indices
    only: a kernel that wraps a key index at the query length (or the reverse) keeps another set
    once the lengths differ (the tenth red-team round, ``docs/results/redteam10/``)."""
    def aux(s: ModShape, rng):
        L = max(s.seqlen_q, s.seqlen_k)
        ids_q = np.zeros((s.batch, s.seqlen_q), np.int32)
        ids_k = np.zeros((s.batch, s.seqlen_k), np.int32)
        for b in range(s.batch):
            n = int(rng.integers(1, max_docs + 1))
            cuts = np.sort(rng.choice(np.arange(1, max(L, 2)), size=min(n - 1, max(L - 1, 0)),
                                      replace=False)) if L > 1 else np.zeros(0, int)
            for ids, n_side in ((ids_q, s.seqlen_q), (ids_k, s.seqlen_k)):
                ids[b] = np.searchsorted(cuts, np.arange(n_side) * L // max(n_side, 1), side="right")
        return [ids_q, ids_k]

    def ref(b, h, qi, ki, a):
        return np.asarray(a[0])[b][np.asarray(qi)] == np.asarray(a[1])[b][np.asarray(ki)]

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def document_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            doc_q = aux_tensors[0]
            doc_k = aux_tensors[1]
            dq = _ssa(doc_q[b[0], q_idx[0]], cutlass.Int32)
            dk = _ssa(doc_k[b[0], kv_idx[0]], cutlass.Int32)
            return dq == dk
        return document_keep, None

    return ModPair("document", "mask", ref, build, aux=aux, features=("mask_mod", "aux_tensors"),
                   description="document mask, int32 doc ids of the queries (batch, seqlen_q) and keys "
                               "(batch, seqlen_k) in aux_tensors[0] and [1]")


PREFIX = 192


def prefix_lm(prefix: int = PREFIX) -> ModPair:
    """Prefix-LM: keys ``< prefix`` are visible to every query, the rest causally
    (``kv <= q``, top-left aligned; self-attention)."""
    P = int(prefix)

    def ref(b, h, qi, ki, a):
        qi, ki = np.asarray(qi), np.asarray(ki)
        return (ki < P) | (ki <= qi)

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def prefix_lm_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            p = _ssa(P, cutlass.Int32)
            return (kv_idx < p) | (kv_idx <= q_idx)
        return prefix_lm_keep, None

    return ModPair("prefix_lm", "mask", ref, build, features=("mask_mod",), self_attention_only=True,
                   description=f"prefix-LM, bidirectional prefix of {P} keys, causal after")


HEAD_SPAN = (8, 16)


def head_window(base: int = HEAD_SPAN[0], step: int = HEAD_SPAN[1]) -> ModPair:
    """A causal window whose width grows with the query head: keep iff ``q - span(h) <= kv <= q``,
    ``span(h) = base + step * h`` (top-left aligned). Heads with local receptive fields of their
    own, one span per head (injective: a kernel that hands the mask the wrong query head --
    PackGQA's packed-row head arithmetic -- keeps another window once a row reaches past the
    smaller span)."""
    B0, S = int(base), int(step)

    def ref(b, h, qi, ki, a):
        qi, ki = np.asarray(qi, np.int64), np.asarray(ki, np.int64)
        return (ki <= qi) & (ki >= qi - (B0 + S * int(h)))

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def head_window_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            span = h * _ssa(S, cutlass.Int32) + _ssa(B0, cutlass.Int32)
            return (kv_idx <= q_idx) & (kv_idx >= q_idx - span)
        return head_window_keep, None

    return ModPair("head_window", "mask", ref, build, features=("mask_mod",), by_head=True,
                   description=f"per-head causal window, span {B0} + {S} h keys")


def _window_keep(qi, ki, left, right, offset):
    c = np.asarray(qi, np.int64) + offset
    ki = np.asarray(ki, np.int64)
    keep = np.ones(np.broadcast_shapes(np.shape(c), np.shape(ki)), bool)
    if left is not None:
        keep &= ki >= c - left
    if right is not None:
        keep &= ki <= c + right
    return keep


def sliding_window(left: Optional[int], right: Optional[int], offset: int = 0, name: str = "") -> ModPair:
    """FA4's ``window_size=(left, right)`` written as a mask_mod: keep iff ``c - left <= kv <=
    c + right`` with ``c = q + offset`` (``offset = seqlen_k - seqlen_q``: FA4's bottom-right
    alignment; None = unbounded side). The keep set equals FA4's window exactly; outputs are
    expected **bitwise** equal to the ``window_size`` call at hd 128 on SM90 (same 128 x 128
    forward tiles, ``_tile_size_fwd_sm90``; the mask_mod path also visits the fully masked KV
    tiles the window path skips, and those add exact zeros to the row sum and O) -- the GPU
    script measures it; the contract judged is the budget."""
    L = None if left is None else int(left)
    Rr = None if right is None else int(right)
    off = int(offset)

    def ref(b, h, qi, ki, a):
        return _window_keep(qi, ki, L, Rr, off)

    def build():
        import cutlass
        import cutlass.cute as cute

        if L is not None and Rr is not None:
            @cute.jit
            def window_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
                c = q_idx + _ssa(off, cutlass.Int32)
                return (kv_idx >= c - _ssa(L, cutlass.Int32)) & \
                    (kv_idx <= c + _ssa(Rr, cutlass.Int32))
        elif L is not None:
            @cute.jit
            def window_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
                c = q_idx + _ssa(off, cutlass.Int32)
                return kv_idx >= c - _ssa(L, cutlass.Int32)
        elif Rr is not None:
            @cute.jit
            def window_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
                c = q_idx + _ssa(off, cutlass.Int32)
                return kv_idx <= c + _ssa(Rr, cutlass.Int32)
        else:
            raise ValueError("sliding_window: at least one side must be bounded")
        return window_keep, None

    if L is None and Rr is None:
        raise ValueError("sliding_window: at least one of left/right must be given")
    return ModPair(name or "sliding_window", "mask", ref, build, features=("mask_mod",),
                   equivalent={"window_size": (L, Rr), "offset": off},
                   description=f"window ({L}, {Rr}) offset {off} as a mask_mod")


def causal_mask(offset: int = 0) -> ModPair:
    """Causal as a mask_mod: keep iff ``kv <= q + offset`` (``offset = seqlen_k - seqlen_q`` is
    FA4's ``causal=True``)."""
    p = sliding_window(None, 0, offset, name="causal")
    return ModPair("causal", "mask", p.ref, p.build, features=("mask_mod",),
                   equivalent={"causal": True, "offset": int(offset)},
                   description=f"causal (kv <= q + {int(offset)}) as a mask_mod")


def checkerboard() -> ModPair:
    """The 128 x 128 checkerboard of :mod:`fa4verify.kernels.mask_mods`."""
    from fa4verify.kernels import mask_mods as mm

    def ref(b, h, qi, ki, a):
        return ((np.asarray(qi) // mm.CHECKER_BLOCK + np.asarray(ki) // mm.CHECKER_BLOCK) % 2) == 0

    return ModPair("checkerboard", "mask", ref, lambda: (mm.checkerboard_128, None), features=("mask_mod",),
                   description="(q // 128 + kv // 128) % 2 == 0")


#: the temperatures of :func:`head_scale` and :func:`batch_length_scale`: powers of two, so the
#: products (forward and score_mod_bwd) are exact in fp32 above the normal range
#: (error_budgets/DERIVATIONS.md#score-mod)
POW2_TEMPERATURES = tuple(2.0 ** -k for k in range(8))


def head_scale() -> ModPair:
    """A temperature per query head: ``y = x t[h]``, ``t[h] = 2^-(h mod 8)`` (fp32, in
    ``aux_tensors[0]``; Lipschitz 1), and its derivative ``t[h]`` in the score_mod_bwd, which reads
    the head too. The head-reading pairs before it (alibi) had a backward that ignores the head
    (dy/dx = 1), so a backward handing score_mod_bwd the wrong head changed no value (red-team
    round 12's ``score_mod_bwd_gqa_head_unscaled``: missed on an H100 twice, at 985b9b8 and
    c6d84c7); here the derivatives of any 8 consecutive heads differ (red-team round 16: a cycle
    of 4 left a head moved by 4 unseen).

    Kernel error (fp32): a product by a power of two, exact where ``|x t| >= 2^-126`` (a subnormal
    product possibly flushed): ``err <= 2^-126``; the score_mod_bwd's ``grad t`` likewise."""
    def aux(s: ModShape, rng):
        return [np.asarray([POW2_TEMPERATURES[i % 8] for i in range(s.nheads)], np.float32)]

    def ref(x, b, h, qi, ki, a):
        return x * float(a[0][h])

    def grad(x, b, h, qi, ki, a):
        return np.full(np.shape(x), float(a[0][h]))

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def head_scale_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            return score * _ssa(aux_tensors[0][h[0]], cutlass.Float32)

        @cute.jit
        def head_scale_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            return grad * _ssa(aux_tensors[0][h[0]], cutlass.Float32)
        return head_scale_score, head_scale_bwd

    return ModPair("head_scale", "score", ref, build, grad=grad, err=_pow2_product_err, aux=aux,
                   features=("score_mod", "score_mod_bwd", "aux_tensors"),
                   description="per-head temperature x t[h], t[h] = 2^-(h mod 8) fp32 in aux_tensors[0]")


def _length_index(b: int, a) -> int:
    sq, sk = a.seqlens[b]
    return (int(b) + sk - sq) & 3


def batch_length_scale() -> ModPair:
    """A temperature from the batch index and the lengths FA4 hands the mods (Note [Lengths the
    mods see]): ``y = x T[(b + seqlen_k - seqlen_q) & 3]``, ``T`` the first four of :data:`POW2_TEMPERATURES` in
    ``aux_tensors[0]``, and its derivative ``T[...]`` in the score_mod_bwd, which reads ``b`` and
    ``seqlen_info`` too: every derivative of the pairs before it ignored both, so a backward
    handing score_mod_bwd another batch entry or other lengths changed no value (the class of
    round 12's F2). Exact in fp32 like :func:`head_scale`: ``err <= 2^-126``."""
    def aux(s: ModShape, rng):
        return [np.asarray(POW2_TEMPERATURES[:4], np.float32)]

    def ref(x, b, h, qi, ki, a):
        return x * float(a[0][_length_index(b, a)])

    def grad(x, b, h, qi, ki, a):
        return np.full(np.shape(x), float(a[0][_length_index(b, a)]))

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def batch_length_scale_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            i = (b[0] + seqlen_info.seqlen_k - seqlen_info.seqlen_q) & 3
            return score * _ssa(aux_tensors[0][i], cutlass.Float32)

        @cute.jit
        def batch_length_scale_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            i = (b[0] + seqlen_info.seqlen_k - seqlen_info.seqlen_q) & 3
            return grad * _ssa(aux_tensors[0][i], cutlass.Float32)
        return batch_length_scale_score, batch_length_scale_bwd

    return ModPair("batch_length_scale", "score", ref, build, grad=grad, err=_pow2_product_err, aux=aux,
                   features=("score_mod", "score_mod_bwd", "aux_tensors", "seqlen_info"),
                   description="temperature x T[(b + seqlen_k - seqlen_q) & 3], T = 2^-k fp32 in aux_tensors[0]")


#: the bias slope of :func:`seqlen_bias` (a power of two: ``c d`` is exact in fp32 for d < 2^24)
SEQLEN_SLOPE = 2.0 ** -5


def _aligned_dist(qi, ki, a, b: int) -> np.ndarray:
    """``|q + (seqlen_k - seqlen_q) - kv|`` with batch entry ``b``'s lengths (``a.seqlens``)."""
    sq, sk = a.seqlens[b]
    return np.abs(np.asarray(qi, np.int64) + (sk - sq) - np.asarray(ki, np.int64)).astype(np.float64)


def seqlen_bias(slope: float = SEQLEN_SLOPE) -> ModPair:
    """A bias aligned bottom-right by the lengths FA4 hands the mod: ``y = x - c |q_idx +
    (seqlen_k - seqlen_q) - kv_idx|`` with ``seqlen_info.seqlen_q`` / ``seqlen_k`` (Note [Lengths
    the mods see]), ``c`` = :data:`SEQLEN_SLOPE`. No aux tensors: FA4 hands it several scores at
    once (``vec_size`` > 1).

    Kernel error (fp32): the distance converts exactly (< 2^24), ``c d`` is exact (c a power of
    two), the subtraction rounds once; bounded as two roundings: ``err <= gamma(2) (|x| + c d)``."""
    c = float(slope)

    def ref(x, b, h, qi, ki, a):
        return x - c * _aligned_dist(qi, ki, a, b)

    def err(x, y, b, h, qi, ki, a):
        g2 = 2 * U32 / (1 - 2 * U32)
        return g2 * (np.abs(x) + c * _aligned_dist(qi, ki, a, b))

    def build():
        import cutlass
        import cutlass.cute as cute
        from cutlass._mlir.dialects import math as mlir_math

        @cute.jit
        def seqlen_bias_score(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            shift = _ssa(seqlen_info.seqlen_k - seqlen_info.seqlen_q, cutlass.Int32).broadcast_to(
                (cute.size(q_idx.shape),))
            diff = q_idx + shift - kv_idx
            dist = cute.TensorSSA(mlir_math.absi(diff), diff.shape, diff.dtype).to(cutlass.Float32)
            return score - dist * c
        return seqlen_bias_score, _identity_bwd()

    return ModPair("seqlen_bias", "score", ref, build, grad=lambda x, *r: np.ones_like(x), err=err,
                   features=("score_mod", "score_mod_bwd", "seqlen_info"),
                   description=f"bias x - {c:g} |q + seqlen_k - seqlen_q - kv| from FA4's seqlen_info")


def causal_aligned() -> ModPair:
    """Causal aligned bottom-right by the lengths FA4 hands the mask: keep iff ``kv_idx <= q_idx +
    seqlen_info.seqlen_k - seqlen_info.seqlen_q`` (Note [Lengths the mods see]): how a
    FlexAttention-style mask_mod writes FA4's own ``causal=True`` for every sequence of a varlen
    batch."""
    def ref(b, h, qi, ki, a):
        sq, sk = a.seqlens[b]
        return np.asarray(ki, np.int64) <= np.asarray(qi, np.int64) + (sk - sq)

    def build():
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def causal_aligned_keep(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            shift = _ssa(seqlen_info.seqlen_k - seqlen_info.seqlen_q, cutlass.Int32)
            return kv_idx <= q_idx + shift
        return causal_aligned_keep, None

    return ModPair("causal_aligned", "mask", ref, build, features=("mask_mod", "seqlen_info"),
                   description="causal kv <= q + seqlen_k - seqlen_q from FA4's seqlen_info")


# Note [Lengths the mods see]
# ---------------------------
# FA4 hands every score and mask mod the tile's ``SeqlenInfoQK`` (flash-attn-4 4.0.0b36,
# ``seqlen_info.py``: ``SeqlenInfoQK.create``): ``seqlen_q`` is ``seqused_q[b]`` where given, else
# ``cu_seqlens_q[b + 1] - cu_seqlens_q[b]``, else the static length (under PackGQA the logical
# one: ``flash_fwd_sm90.py``'s ``mQ.shape[0][1]``); ``seqlen_k`` likewise (paged: the page size
# times the pages per sequence). So a mod sees batch entry b's used lengths in every call form: a
# FlexAttention-style mod aligns a diagonal bottom-right with them (or indexes a packed array). A
# fault in what FA4 hands there (another sequence's lengths, the static maximum, the backward's
# roles swapped) is visible only to a mod that reads them: :func:`seqlen_bias` and
# :func:`causal_aligned` do, their references reading ``aux.seqlens[b]`` (from
# ``AttentionProblem._seq_bounds``, through ``fa4verify.mods.aux_for``). The offsets
# (``offset_q`` / ``offset_k``) depend on the call's layout (capacity offsets in the packed
# seqused forms) and are read by no pair.


WINDOW = (128, 0)


def library() -> list[ModPair]:
    """fa4verify's built-in pairs (the default parameters the GPU script and tests use)."""
    return [alibi(), rel_bias(), rel_scale(), scalar_bias(), default_slope(), softcap_mod(), document_mask(), prefix_lm(),
            head_window(), sliding_window(*WINDOW), causal_mask(), checkerboard(), seqlen_bias(), causal_aligned(),
            head_scale(), batch_length_scale()]
