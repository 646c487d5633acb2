"""Note [Kernel variants]: every SM90 kernel configuration FA4 picks for the audit's space is run.

The plan covers every pair of dimension values and every mask x call form x pass triple, but FA4
compiles one kernel per *combination* of its host choices: the tile configuration
``_tile_size_fwd_sm90`` / ``_tile_size_bwd_sm90`` returns for the head dims and the mask (tile
sizes, swapAB flags, stages, register-held P, one dQ warpgroup), the mask mode the kernel
specialises on (none, causal, local), PackGQA and whether its tile_m takes the TMA load of Q and
store of O (``tile_m % qhead_per_kvhead == 0``), and in the backward GQA accumulation and the
deterministic dQ order. A fault inside code only one such combination compiles is visible only if
some audit call compiles it. Red-team round 13 (``docs/results/redteam13/``) found nine backward
and two forward combinations no call of the default audit reached at seed 0 -- among them FA4's
default GPT-style training call (hd 64, causal, MHA, ``deterministic=False``), every
non-deterministic hd-256 backward and the PackGQA forward at hd 192 / hdv 128 -- though each of
their branch sides was reached on its own. At seed 0 the SM90 bf16 audit's rows and edges reach
140 dense variants, and 34 more calls reach the rest (4 of them block-sparse).

:func:`variant_edges` decides this by construction: it enumerates the combinations of the
space's head-dim classes, masks, GQA ratios and deterministic modes on a dense call, keys each by
the variant FA4's own host functions give (:func:`fwd_variant`, :func:`bwd_variant`: the tile
configuration, mask mode, PackGQA or GQA, deterministic mode, and the head-dim relations the
kernels specialise on: hd == hdv, hd > 128, hdv > 128), takes away
the variants the plan's rows and the constructed edges already run, and adds one small call per
variant left (``variant_fwd_...`` / ``variant_bwd_...``). SM90 only (the SM 10.x kernels choose by
other rules; their variants are not modelled here)."""
from __future__ import annotations

from typing import Any, Optional

from fa4verify.coverage.space import FeatureSpace

__all__ = ["fwd_variant", "bwd_variant", "variant_edges"]

#: the row values a variant edge takes besides its combination (a dense call of a few tiles)
_BASE_ROW = {"form": "dense", "seqlen": "multi", "softcap": "off", "sink": "off", "values": "normal"}


def _mode(causal: bool, local: bool) -> str:
    return "local" if local else ("causal" if causal else "none")


def _resolved(problem: Any) -> tuple[bool, bool]:
    """(causal, local) as the forward kernel sees them: FA4 drops both for a mask_mod."""
    from fa4verify.problem import resolve_window
    call = problem.call
    mask_pair = bool(problem.mods) and problem.mod_pairs()[1] is not None
    if mask_pair or (call is not None and call.mask_mod_fn is not None):
        return False, False
    causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
    return bool(causal), bool(local)


def _shape(problem: Any) -> tuple[bool, bool, bool]:
    """The head-dim relations the kernels specialise on beside their tile configuration: hd ==
    hdv (the V / O tiles are Q / K's), hd > 128 and hdv > 128 (a second O rescale before the
    P V GEMM, ``rescale_O_before_gemm``; 256-wide smem atoms)."""
    return problem.head_dim == problem.head_dim_v, problem.head_dim > 128, problem.head_dim_v > 128


def fwd_variant(problem: Any) -> Optional[tuple]:
    """The SM90 forward kernel variant of ``problem``: (FA4's ``FwdConfig`` fields, mask mode,
    PackGQA, TMA for Q/O under PackGQA, the head-dim relations); None off SM90 or without FA4."""
    from fa4verify.kernels.fa4_params import sm90_fwd_variant_config
    if problem.arch != "sm90":
        return None
    causal, local = _resolved(problem)
    call = problem.call
    block = getattr(call, "block_size", None) if call is not None else None
    cfg = sm90_fwd_variant_config(problem.head_dim, problem.head_dim_v, causal, local,
                                  tuple(block) if block else None)
    if cfg is None:
        return None
    g = problem.nheads // problem.nheads_kv
    packed = g > 1 and not (call is not None and call.pack_gqa is False)
    return ("fwd", cfg, _mode(causal, local), packed, (not packed) or cfg[0] % g == 0, _shape(problem))


def bwd_variant(problem: Any, deterministic: bool) -> Optional[tuple]:
    """The SM90 backward kernel variant of ``problem``: (FA4's ``BwdConfig`` fields, mask mode, GQA
    accumulation, deterministic, the head-dim relations); None off SM90 or without FA4. The
    backward keeps ``causal`` passed with a mask_mod (known issue ``mask_mod_causal_bwd``)."""
    from fa4verify.kernels.fa4_params import sm90_bwd_variant_config
    if problem.arch != "sm90":
        return None
    causal, local = _resolved(problem)
    if problem.call is not None and problem.call.mask_causal:
        causal, local = True, False
    block = getattr(problem.call, "block_size", None) if problem.call is not None else None
    fields = sm90_bwd_variant_config(problem.head_dim, problem.head_dim_v, bool(causal), bool(local),
                                     block[0] if block else None)
    if fields is None:
        return None
    return ("bwd", fields, _mode(bool(causal), bool(local)), problem.nheads > problem.nheads_kv, bool(deterministic),
            _shape(problem))


def reached(cases: list[tuple[Any, bool, bool]]) -> set[tuple]:
    """The variants ``(problem, runs the backward, deterministic)`` cases compile."""
    out: set[tuple] = set()
    for p, bwd, det in cases:
        v = fwd_variant(p)
        if v is not None:
            out.add(v)
        if bwd:
            v = bwd_variant(p, det)
            if v is not None:
                out.add(v)
    return out


def _tag(v: tuple) -> str:
    if v[0] == "fwd":
        (m, n, rs, _ol), mode, packed, tma = v[1], v[2], v[3], v[4]
        return f"fwd_{m}x{n}{'_rs' if rs else ''}_{mode}" + (f"_pack{'' if tma else '_cpasync'}" if packed else "")
    f, mode, gqa, det = v[1], v[2], v[3], v[4]
    return f"bwd_{f[0]}x{f[1]}_{mode}_{'gqa' if gqa else 'mha'}_{'det' if det else 'nondet'}"


def variant_edges(space: FeatureSpace, cases: list[tuple[Any, bool, bool]], *, seed: int = 0
                  ) -> list[tuple[str, Any, bool, bool]]:
    """Note [Kernel variants]: ``(name, problem, backward, deterministic)`` of one dense call per
    SM90 kernel variant of the space's combinations (head-dim class x mask x GQA ratio x
    deterministic) that no case of ``cases`` (``(problem, backward, deterministic)``: the plan's
    rows and the constructed edges) compiles. A variant first met on a forward-only combination
    runs forward only; a deployment's own head counts or lengths stay the space's."""
    from fa4verify.coverage.cases import problem_for
    if space.arch != "sm90" or "dense" not in space.values["form"] or space.dtype == "fp8":
        return []
    have = reached(cases)
    seqlen = _BASE_ROW["seqlen"] if _BASE_ROW["seqlen"] in space.values["seqlen"] else space.values["seqlen"][0]
    out: list[tuple[str, Any, bool, bool]] = []
    dims = ("form", "hd", "mask", "gqa", "det")
    for form in (f for f in _FORMS if f in space.values["form"]):
        for name in space.values["hd"]:
            for mask in space.values["mask"]:
                for gqa in space.values["gqa"]:
                    for det in space.values["det"]:
                        row = {**_BASE_ROW, "form": form, "seqlen": seqlen, "hd": name, "mask": mask, "gqa": gqa,
                               "det": det, "scale": space.values["scale"][0], "values": space.values["values"][0]}
                        if any(space.why_not({a: row[a], b: row[b]}) is not None
                               for a in dims for b in dims if a < b):
                            continue
                        bwd = space.no_backward({"form": form, "hd": name, "gqa": gqa, "mask": mask}) is None
                        if bwd and det == "on" and form in _NO_DETERMINISTIC:
                            continue
                        p = problem_for(space, row, 10_000 + len(out), seed=seed)
                        want = [v for v in (fwd_variant(p), bwd_variant(p, det == "on") if bwd else None)
                                if v is not None and v not in have]
                        if not want:
                            continue
                        have.update(want)
                        tag = "_".join(_tag(v) for v in want)
                        out.append((f"variant_{_FORMS[form]}d{p.head_dim}"
                                    + (f"x{p.head_dim_v}" if p.head_dim_v != p.head_dim else "") + f"_{tag}",
                                    p, bwd, det == "on"))
    return out


#: the call forms whose kernel variants are enumerated, and their edge-name prefix: dense, and
#: block sparsity (its blocks fit FA4's tiles: ``_fit_sm90_fwd_tile_to_block_sparsity``, the
#: backward's tile_m to the sparse Q block; red-team round 13: a tile_m-64 forward and the hd-256
#: sparse backward were each reached by one or two seed-drawn rows only)
_FORMS = {"dense": "", "block_sparse": "bs_"}
#: forms whose backward FA4 runs without ``deterministic`` only (the SM90 block-sparse backward
#: asserts it)
_NO_DETERMINISTIC = ("block_sparse",)
