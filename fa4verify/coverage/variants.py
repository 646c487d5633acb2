"""Note [Kernel variants]: every kernel configuration FA4 picks for the audit's space is run (SM90 and SM 10.x).

The plan covers every pair of dimension values and every mask x call form x pass triple, but FA4
compiles one kernel per *combination* of its host choices. A fault inside code only one such
combination compiles is visible only if some audit call compiles it.

SM90. The choices are the tile configuration ``_tile_size_fwd_sm90`` / ``_tile_size_bwd_sm90``
returns for the head dims and the mask (tile sizes, swapAB flags, stages, register-held P, one dQ
warpgroup), the mask mode the kernel specialises on (none, causal, local), PackGQA and whether its
tile_m takes the TMA load of Q and store of O (``tile_m % qhead_per_kvhead == 0``), and in the
backward GQA accumulation and the deterministic dQ order. Red-team round 13
(``docs/results/redteam13/``) found nine backward and two forward combinations no call of the
default audit reached at seed 0 -- among them FA4's default GPT-style training call (hd 64, causal,
MHA, ``deterministic=False``) -- though each of their branch sides was reached on its own.

SM 10.x (sm100, sm103). FA4 decides inline (``_flash_attn_fwd``, the kernel classes'
``__init__``), so the key is read from the kernel object FA4's own host code builds: the call runs
through ``ProductionTarget(fake=True)`` (FakeTensorMode, nothing compiled or launched) inside
:func:`fa4verify.kernels.fa4_params.recording_compiles`, and
:func:`~fa4verify.kernels.fa4_params.sm100_fwd_variant_key` / ``sm100_bwd_variant_key`` key it:
padded head dims, mask mode, tile, q_stage, 2-CTA, S ping-pong, PackGQA with TMA or cp.async Q, the
O epilogue, split-KV and the exp2-emulation share; in the backward the CTA schedule, GQA,
deterministic and its semaphore order (red-team round 14's coarse key, ``docs/results/redteam14/``:
the tile scheduler left out). On a CPU this needs a fake device (the compile-only shims are
installed); on a real SM 10.x GPU the same host path runs, no fake device entered. Round 14 found,
among others, FA4's default hd-64 causal MHA non-deterministic backward, every hd-192/128 causal
backward and the hd-256 causal MHA backwards unreached on a B200. The forward's q_stage, 2-CTA and S
ping-pong follow the lengths, so the enumeration crosses the seqlen class too; the SM100 backward
kernel does not, so its key is read at the base class only (``tests/test_kernel_variants_sm100.py``
checks every class).

:func:`variant_edges` decides this by construction: it enumerates the combinations of the
space's call forms (dense, block-sparse), head-dim classes, masks, GQA ratios, deterministic modes
(and on SM 10.x seqlen classes), keys each by the variant FA4 picks (:func:`fwd_variant`,
:func:`bwd_variant`), takes away the variants the plan's rows and the constructed edges already
run, and adds one small call per variant left (``variant_fwd_...`` / ``variant_bwd_...``). 16-bit
dtypes only. At seed 0 the default bf16 audit adds 34 such calls on SM90 and 102 on a (fake) B200
(``docs/results/sm100_variants/``: keying them takes ~10 s there, the plan's calls ~7 s more)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fa4verify.coverage.space import FeatureSpace
from fa4verify.kernels.facts import is_sm100_family

__all__ = ["fwd_variant", "bwd_variant", "variant_edges", "statistical_calls"]

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
    """The forward kernel variant of ``problem``. SM90: (FA4's ``FwdConfig`` fields, mask mode,
    PackGQA, TMA for Q/O under PackGQA, the head-dim relations); SM 10.x: the key of the kernel
    object FA4's host code builds (:func:`fa4verify.kernels.fa4_params.sm100_fwd_variant_key`).
    None on other archs, without FA4, where FA4 refuses the call, or (SM 10.x) where its host
    code cannot run here (:func:`_sm100_host_ready`)."""
    from fa4verify.kernels.fa4_params import sm90_fwd_variant_config
    if is_sm100_family(problem.arch):
        return _sm100_keys(problem, ()).get("fwd")
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
    """The backward kernel variant of ``problem`` run with ``deterministic``. SM90: (FA4's
    ``BwdConfig`` fields, mask mode, GQA accumulation, deterministic, the head-dim relations; the
    backward keeps ``causal`` passed with a mask_mod: known issue ``mask_mod_causal_bwd``); SM 10.x:
    the key of the kernel object FA4's host code builds
    (:func:`fa4verify.kernels.fa4_params.sm100_bwd_variant_key`). None as :func:`fwd_variant`, and
    where FA4 has no backward for the call."""
    from fa4verify.kernels.fa4_params import sm90_bwd_variant_config
    if is_sm100_family(problem.arch):
        return _sm100_keys(problem, (bool(deterministic),)).get(bool(deterministic))
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


# -- SM 10.x: the kernel objects FA4's host code builds for the call ---------------------------

#: Note [Kernel variants]: the SM 10.x keys of each call shape this process recorded (the problem's
#: JSON without its values: FA4 picks its kernels from shapes and flags, never from data) ->
#: ``{"fwd": key, False: backward key, True: deterministic backward key}``
_SM100_KEYS: dict[str, dict] = {}

#: what FA4 raises refusing a call on its host path (a combination it does not build)
_REFUSALS = (AssertionError, ValueError, NotImplementedError)


def _sm100_host_ready() -> bool:
    """Whether FA4's SM 10.x host code can run in this process: a real GPU (FA4 reads its arch, or
    ``FLASH_ATTENTION_ARCH``) or, on a machine without one, a fake device (Note [Fake device
    audit]: the compile-only shims are installed, as in a compile-only process); and the arch FA4
    builds for is SM 10.x. A real GPU's audit never enters a fake device here."""
    import os
    from fa4verify.kernels import device, facts
    if device.fake_device() is not None:
        from fa4verify.compile.production import _shims
        _shims()           # the driver queries of FA4's host path answered for the fake device
    elif device.local_gpu() is None:
        return False
    env = os.environ.get("FLASH_ATTENTION_ARCH")
    arch = facts.arch_of_fa4_arch_env(env) if env else device.local_gpu().arch
    return arch is not None and is_sm100_family(arch)


def _sm100_keys(problem: Any, dets: tuple[bool, ...], *, inputs: Optional[dict] = None) -> dict:
    """The SM 10.x keys of ``problem``'s forward and of its backward with each of ``dets``: the
    call goes through ``ProductionTarget(fake=True)`` (FakeTensorMode: FA4's host code runs, no
    kernel is compiled or launched) inside :func:`fa4verify.kernels.fa4_params.recording_compiles`,
    and each main kernel object FA4 builds is keyed. ``inputs``: the arrays of the call
    (``problem.materialize()`` unless given; the fake target reads only their shapes). Memoised
    per call shape within the process; ``{}`` where the host code cannot run here."""
    from fa4verify.problem import ValueSpec
    shape = problem.replace(values=ValueSpec()).to_json()
    got = _SM100_KEYS.get(shape, {})
    need = [d for d in dets if d not in got]
    if "fwd" in got and not need:
        return got
    if not _sm100_host_ready():
        return {}
    from fa4verify.errors import Unsupported
    from fa4verify.kernels.fa4_params import (SM100_MAIN_BWD, SM100_MAIN_FWD, recording_compiles,
                                              sm100_bwd_variant_key, sm100_fwd_variant_key)
    from fa4verify.targets import ProductionTarget
    tgt = ProductionTarget(fake=True)
    a = problem.materialize() if inputs is None else inputs
    got = {"fwd": None, **got}
    with recording_compiles() as rec:
        try:
            out = tgt.forward(problem, a)
        except (Unsupported, *_REFUSALS):
            out = None
        got["fwd"] = next((sm100_fwd_variant_key(c, at) for c, at in rec if c in SM100_MAIN_FWD), None)
        for det in need:
            got[det] = None
            if out is None or tgt.backward_unsupported(problem) is not None:
                continue
            rec.clear()
            try:
                tgt.backward(problem, a, out, deterministic=det)
            except (Unsupported, *_REFUSALS):
                continue
            got[det] = next((sm100_bwd_variant_key(c, at, gqa=problem.nheads > problem.nheads_kv,
                                                   deterministic=det) for c, at in rec if c in SM100_MAIN_BWD), None)
    _SM100_KEYS[shape] = got
    return got


def _zero_inputs(problem: Any) -> dict:
    """``materialize()``'s arrays for a base-row call of :func:`variant_edges` (dense or block-sparse
    form, no sink, no descales), as zeros: the fake target reads shapes and dtypes only, and drawing
    the values took a third of the SM 10.x enumeration's time."""
    sh = problem.shapes()
    a: dict = dict.fromkeys(("learnable_sink", "cu_seqlens_q", "cu_seqlens_k", "mask", "q_descale", "k_descale",
                             "v_descale"))
    a.update({n: np.zeros(sh[s], np.float32) for n, s in (("q", "q"), ("k", "k"), ("v", "v"), ("dout", "out"))})
    return a


def reached(cases: list[tuple[Any, bool, bool]], *, by_twin: bool = False) -> set[tuple]:
    """The variants ``(problem, runs the backward, deterministic)`` cases compile; ``by_twin``:
    only on calls whose forward (a backward variant: and backward) the CPU twin runs too, where
    the statistical tier can judge them (Note [A statistical verdict per kernel variant])."""
    out: set[tuple] = set()
    for p, bwd, det in cases:
        fwd_ok, bwd_ok = _stat_judges(p, bwd)[:2] if by_twin else (True, True)
        v = fwd_variant(p)
        if v is not None and fwd_ok:
            out.add(v)
        if bwd and bwd_ok:
            v = bwd_variant(p, det)
            if v is not None:
                out.add(v)
    return out


def _tag(v: tuple) -> str:
    if v[0] == "fwd" and v[1] == "sm100":
        (_f, _a, _hdp, _hdvp, oob, mode, _tm, tn, qs, cta2, pp, pack, tma_q, tma_o, split, freq, start) = v
        return (f"fwd_{mode}_q{qs}" + (f"_n{tn}" if tn != 128 else "") + ("_2cta" if cta2 else "")
                + ("_pingpong" if pp else "") + (("_pack" + ("" if tma_q else "_cpasync")) if pack else "")
                + ("" if tma_o else "_epiO") + ("_split" if split else "") + f"_ex2f{freq}s{start}"
                + ("_oob" if oob else ""))
    if v[0] == "bwd" and v[1] in ("sm100", "sm100_hd256"):
        (_b, _a, _th, _thv, oob, mode, _tm, tn, sched, gqa, det, _spt, _split, qsub, kvsub) = v
        return (f"bwd_{mode}_{str(sched).replace('CtaSchedule.', '').lower()}" + (f"_n{tn}" if tn != 128 else "")
                + (f"_qsub{qsub}" if qsub != 2 else "") + (f"_kvsub{kvsub}" if kvsub != 1 else "")
                + ("_oob" if oob else "") + f"_{'gqa' if gqa else 'mha'}_{'det' if det else 'nondet'}")
    if not isinstance(v[1], tuple):      # another kernel's key (SM 10.x MLA): its class and a digest
        import hashlib
        return f"{v[0]}_{v[1]}_{hashlib.sha256(repr(v).encode()).hexdigest()[:8]}"
    if v[0] == "fwd":
        (m, n, rs, _ol), mode, packed, tma = v[1], v[2], v[3], v[4]
        return f"fwd_{m}x{n}{'_rs' if rs else ''}_{mode}" + (f"_pack{'' if tma else '_cpasync'}" if packed else "")
    f, mode, gqa, det = v[1], v[2], v[3], v[4]
    return f"bwd_{f[0]}x{f[1]}_{mode}_{'gqa' if gqa else 'mha'}_{'det' if det else 'nondet'}"


def variant_edges(space: FeatureSpace, cases: list[tuple[Any, bool, bool]], *, seed: int = 0,
                  by_twin: bool = False) -> list[tuple[str, Any, bool, bool]]:
    """Note [Kernel variants]: ``(name, problem, backward, deterministic)`` of one call per kernel
    variant of the space's combinations (call form x head-dim class x mask x GQA ratio x
    deterministic; on SM 10.x x seqlen class too) that no case of ``cases`` (``(problem,
    backward, deterministic)``: the plan's rows and the constructed edges) compiles -- with
    ``by_twin``, none that the CPU twin runs too (:func:`reached`: a variant only a score-mod call
    compiles gets a plain call the statistical tier can judge). A variant
    first met on a forward-only combination runs forward only; a deployment's own head counts or
    lengths stay the space's. SM90 and SM 10.x, 16-bit dtypes; [] elsewhere."""
    import itertools
    from fa4verify.coverage.cases import problem_for
    sm100 = is_sm100_family(space.arch)
    if not (sm100 or space.arch == "sm90") or "dense" not in space.values["form"] or space.dtype == "fp8":
        return []
    have = reached(cases)
    judged = reached(cases, by_twin=True) if by_twin else have      # Note [A statistical verdict per kernel variant]
    base_seqlen = _BASE_ROW["seqlen"] if _BASE_ROW["seqlen"] in space.values["seqlen"] else space.values["seqlen"][0]
    if sm100:
        # q_stage, 2-CTA and S ping-pong follow the lengths (red-team round 14): every seqlen class,
        # the base one first. The backward's kernel does not (tests/test_kernel_variants_sm100.py
        # checks it): it is keyed at the base class only
        seqlens = (base_seqlen,) + tuple(s for s in space.values["seqlen"] if s != base_seqlen)
        dims = ("form", "hd", "mask", "gqa", "seqlen", "det")
    else:
        seqlens = (base_seqlen,)
        dims = ("form", "hd", "mask", "gqa", "det")
    forms = [f for f in _FORMS if f in space.values["form"]]
    out: list[tuple[str, Any, bool, bool]] = []
    names: set[str] = set()
    n_shapes = 0
    for form, name, mask, gqa, seqlen in itertools.product(forms, space.values["hd"], space.values["mask"],
                                                           space.values["gqa"], seqlens):
        base = {**_BASE_ROW, "form": form, "seqlen": seqlen, "hd": name, "mask": mask, "gqa": gqa,
                "scale": space.values["scale"][0], "values": space.values["values"][0]}
        dets = [d for d in space.values["det"]
                if not any(space.why_not({a: r[a], b: r[b]}) is not None
                           for r in ({**base, "det": d},) for a in dims for b in dims if a < b)]
        if not dets:
            continue
        bwd = space.no_backward({"form": form, "hd": name, "gqa": gqa, "mask": mask}) is None \
            and seqlen == base_seqlen
        if sm100:      # one call per shape: its forward and both backwards recorded in one pass
            shape = problem_for(space, base, 10_000 + n_shapes, seed=seed)
            n_shapes += 1
            _sm100_keys(shape, tuple(d == "on" for d in dets) if bwd else (), inputs=_zero_inputs(shape))
        for det in dets:
            if not sm100 and bwd and det == "on" and form in _NO_DETERMINISTIC:
                continue
            p = shape if sm100 else problem_for(space, {**base, "det": det}, 10_000 + len(out), seed=seed)
            vs = [fwd_variant(p), bwd_variant(p, det == "on") if bwd else None]
            oks = _stat_judges(p, bwd)[:2] if by_twin else (True, True)
            # a variant no call compiles, or (by_twin) none the statistical tier judges and this one does
            want = [v for v, ok in zip(vs, oks) if v is not None and (v not in have or (ok and v not in judged))]
            if not want:
                continue
            have.update(want)
            if by_twin:
                judged.update(v for v, ok in zip(vs, oks) if v is not None and ok)
            edge = (f"variant_{_FORMS[form]}d{p.head_dim}" + (f"x{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")
                    + f"_{'_'.join(_tag(v) for v in want)}")
            if edge in names:
                edge += f"_{len(out)}"
            names.add(edge)
            out.append((edge, p, bwd, det == "on"))
    return out


#: the call forms whose kernel variants are enumerated, and their edge-name prefix: dense, and
#: block sparsity (its blocks fit FA4's tiles: ``_fit_sm90_fwd_tile_to_block_sparsity``, the
#: backward's tile_m to the sparse Q block; red-team round 13: a tile_m-64 forward and the hd-256
#: sparse backward were each reached by one or two seed-drawn rows only)
_FORMS = {"dense": "", "block_sparse": "bs_"}
#: forms whose SM90 backward FA4 runs without ``deterministic`` only (the SM90 block-sparse backward
#: asserts it; the SM 10.x one takes ``deterministic``)
_NO_DETERMINISTIC = ("block_sparse",)


#: the rows (query or key token x head) a call must give each tensor the statistical tier judges:
#: twice the tier's minimum (``_MIN_ROWS`` of fa4verify.judge.statistical), for rows whose
#: references are too small to count
STAT_ROWS = 40


def stat_rows(problem: Any) -> tuple[int, int, int]:
    """(query rows that see a key: O; query rows that see two or more: dQ -- one visible key makes
    P = 1 and dS = 0; key rows such a query row sees, per KV head: dK, dV) of ``problem``'s masks."""
    H, Hk = problem.nheads, problem.nheads_kv
    r_out = r_dq = r_kv = 0
    for m in problem.keep_masks():
        m = np.asarray(m, bool)
        m = np.broadcast_to(m, (H,) + m.shape[-2:]) if m.ndim == 2 else m
        vis = m.sum(axis=-1)                                        # (H, lq)
        r_out += int((vis >= 1).sum())
        r_dq += int((vis >= 2).sum())
        keys = (m & (vis >= 2)[..., None]).any(axis=1)             # (H, lk)
        r_kv += int(keys.reshape(Hk, H // Hk, -1).any(axis=1).sum())
    return r_out, r_dq, r_kv


def _twin_runs(problem: Any, backward: bool) -> tuple[bool, bool]:
    """(whether the statistical tier can judge the forward of ``problem`` -- the CPU twin predicts
    it, :func:`fa4verify.fuzz.properties.stat_tier_unmodelled`, and O has :data:`STAT_ROWS` rows
    whose references count -- and its backward where ``backward``: the twin's backward, and dQ and
    dK / dV rows). Scores shifted down by 100 beside a learnable sink leave every weight ~e^-100:
    references below bf16's range, no rows (measured on an H100: 1 usable row of O)."""
    from fa4verify.fuzz.properties import stat_tier_unmodelled
    from fa4verify.targets import TwinTarget
    if stat_tier_unmodelled(problem) is not None or (problem.sink
                                                     and problem.values.distribution == "negative_scores"):
        return False, False
    r_out, r_dq, r_kv = stat_rows(problem)
    fwd = r_out >= STAT_ROWS
    return fwd, (fwd and bool(backward) and TwinTarget().backward_unsupported(problem) is None
                 and r_dq >= STAT_ROWS and r_kv >= STAT_ROWS)


def _stat_judges(problem: Any, backward: bool) -> tuple[bool, bool, int, int]:
    """(whether the statistical tier judges the forward of ``problem``, its backward, and how many
    of O / of dQ, dK, dV a known FA4 issue covers by configuration there -- they get no verdict):
    :func:`_twin_runs`, and not every tensor of the pass covered (asked before any input exists: a
    rule that reads the values -- the sink overflow -- is asked again when the call runs, whose
    verdict on a tensor it covers then is not formed and said so,
    :func:`fa4verify.fuzz.properties.known_configuration`)."""
    from fa4verify.fuzz.properties import known_configuration

    def covered(q: str) -> bool:
        return known_configuration(problem, None, "production", q, unanswered_covers=False) is not None
    fwd_ok, bwd_ok = _twin_runs(problem, backward)
    blind_f = int(fwd_ok and covered("out"))
    blind_b = sum(covered(q) for q in ("dq", "dk", "dv")) if bwd_ok else 0
    return fwd_ok and blind_f < 1, bwd_ok and blind_b < 3, blind_f, blind_b


def _twin_cost(problem: Any) -> float:
    """The twin's work for ``problem``, what the selection minimises: per sequence (a batch entry
    or a varlen sequence) its query rows, at least 64, times its keys in 128-key blocks, at least
    one (the twin walks FA4's KV tiles a sequence at a time, each block step a fixed cost on short
    rows), times heads and head dims. Timed on the CPU (seed 0's statistical calls, SM90, one process
    alone): seconds per unit within a factor 8 across dense and varlen calls, where the pair count
    spread 800-fold and put a varlen call of 257 sequences of at most 9 x 13 (2.9 s) 45 times below
    a dense b=2 call of 389 x 439 (1.4 s), and the selection took it."""
    segs = (zip(problem.seqlens_q, problem.seqlens_k) if problem.varlen
            else [(problem.seqlen_q, problem.seqlen_k)] * problem.batch)
    work = sum(max(lq, 64) * max(1, -(-lk // 128)) * 128 for lq, lk in segs)
    return float(work * problem.nheads * (problem.head_dim + problem.head_dim_v))


def statistical_calls(cases: list[tuple[Any, bool, bool]], *, limit: int) -> tuple[dict[int, list[str]], list[str]]:
    """Note [A statistical verdict per kernel variant]
    -----------------------------------------------
    Every kernel variant the audit's calls compile (``cases``: ``(problem, backward,
    deterministic)``, in the audit's order: the plan's rows, the constructed edges, the variant
    edges, the judged siblings) gets one statistical verdict (the ``stat_tier`` property,
    fa4verify/fuzz/properties.py): on a call that compiles it and whose forward (for a forward
    variant) or forward and backward (a backward variant) the CPU twin runs -- of those, one with
    the fewest tensors a known FA4 issue covers by configuration (they get no verdict), then the
    cheapest -- the call's
    error distribution against the twin's on the same inputs (where the twin's prediction is the
    kernel's arithmetic to fp32 level: no softcap, no huge or outlier values,
    :func:`fa4verify.fuzz.properties.stat_tier_unmodelled`; a variant only such calls compile gets a
    variant edge of its own, :func:`variant_edges` ``by_twin``). The per-element bounds admit a
    variant-confined bias of a fraction of an ulp (round 13's catalogue: dK scaled by 1 + 2^-7 in
    one SM90 backward variant, 1-2 bf16 ulp, passed the H200's plan at tightness 0.43); the tier's
    margin is 2^-8 ulp. Returns ``{case index: the variants it judges}`` and the variants no call
    the twin runs reaches (reported by name: the worst-case tier judged them, the statistical one
    could not). At most ``limit`` calls (the tier's level is set for that many); more is an error
    of the plan."""
    best: dict[tuple, tuple[int, float, int]] = {}
    reached_by: dict[tuple, bool] = {}
    label: dict[tuple, str] = {}
    for i, (p, bwd, det) in enumerate(cases):
        fv = fwd_variant(p)
        bv = bwd_variant(p, det) if bwd else None
        if fv is None and bv is None:
            continue
        # a tensor a known issue covers by configuration gets no statistical verdict: fewer first
        fwd_ok, bwd_ok, blind_f, blind_b = _stat_judges(p, bv is not None)
        cost = _twin_cost(p) * (3.0 if bwd else 1.0)
        for v, ok, blind in ((fv, fwd_ok, blind_f), (bv, bwd_ok, blind_b)):
            if v is None:
                continue
            reached_by.setdefault(v, False)
            label.setdefault(v, f"d{p.head_dim}" + (f"x{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")
                             + f"_{_tag(v)}")
            if ok:
                reached_by[v] = True
                if v not in best or (blind, cost) < best[v][:2]:
                    best[v] = (blind, cost, i)
    out: dict[int, list[str]] = {}
    for v, (_b, _c, i) in best.items():
        out.setdefault(i, []).append(label[v])
    if len(out) > limit:
        raise ValueError(f"{len(out)} calls for the statistical tier, more than its level is set for ({limit})")
    unjudged = sorted({label[v] for v, ok in reached_by.items() if not ok})
    return out, unjudged
