"""The ``attention_problems`` composite strategy (and ``mod_problems``, ``problem_groups``) that
draws :class:`~fa4verify.problem.AttentionProblem` instances FA4 accepts.
"""
from __future__ import annotations

import json
from typing import Any, Collection, Optional

from hypothesis import reject, strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify._strategies.calls import DEFAULT_PAGE_SIZES, keep_call_forms, q_call_forms, with_pack_gqa, kv_call_forms
from fa4verify._strategies.masks import causal_and_windows, mask_mods, softcaps, varlen_seqlens
from fa4verify._strategies.shapes import check_arch, check_dtype, head_counts, head_dims, seqlen_pairs
from fa4verify._strategies.values import value_specs
from fa4verify.problem import (CALL_FEATURES, DISTRIBUTIONS, FEATURES, MOD_FEATURE, AttentionProblem, CallForm,
                               resolve_window)


def _arch_features(arch: str, head_dim: int, head_dim_v: int) -> set[str]:
    """Features FA4's forward lacks for a head-dim pair: those a dedicated SM100 (256, 256) forward
    asserts away (:func:`fa4verify.kernels.facts.sm100_hd256_lacks`; none with the pinned 4.0.0b36,
    whose generic SM100 forward runs (256, 256)). The backward's limits are the target's
    (``backward_unsupported``): the draw keeps the forward's features."""
    from fa4verify.kernels import facts
    lacks = facts.sm100_hd256_lacks(arch, head_dim, head_dim_v, "fwd")
    drawn_as = {"softcap": {"softcap"}, "sink": {"sink"}, "local": {"local"}, "score_mod": {MOD_FEATURE},
                "mask_mod": {"mask_mod", "mask_mod_fn", MOD_FEATURE}, "block_sparse": {"block_sparse"},
                "dlse": set()}       # not a drawn feature (the bwd_stages dLSE pass asks the target)
    return set().union(*(drawn_as[lack] for lack in lacks))


@st.composite
def attention_problems(draw: DrawFn, *, dtype: Optional[str] = None, arch: str = "sm90", max_seqlen: int = 256,
                       max_batch: int = 3, max_heads: int = 4, max_head_dim: int = 128,
                       features: Collection[str] = FEATURES, distributions: Optional[Collection[str]] = None,
                       max_work: Optional[int] = None,
                       head_dim_choices: Optional[Collection[Any]] = None,
                       page_sizes: Collection[int] = DEFAULT_PAGE_SIZES,
                       hostile_nan: bool = False,
                       head_count_choices: Optional[Collection[tuple[int, int]]] = None,
                       seqlen_q_range: Optional[tuple[int, int]] = None,
                       seqlen_k_range: Optional[tuple[int, int]] = None,
                       mask_choices: Optional[Collection[str]] = None,
                       window_choices: Collection[tuple[int, int]] = (),
                       softcap_choices: Optional[Collection[float]] = None,
                       sinks: Optional[bool] = None,
                       scale_choices: Optional[Collection[Optional[float]]] = None,
                       sink_dtype: Optional[str] = None) -> AttentionProblem:
    """Draw an :class:`AttentionProblem` that FA4 accepts on ``arch``. Never runs a kernel.

    Arguments (all keyword-only):

    * ``dtype``: "bf16" or "fp16"; None draws either (bf16 first).
    * ``arch``: "sm90" (head dims 8..256, multiples of 8) or "sm100" (8..128, (192, 128),
      (256, 256)); unsupported values raise :class:`InvalidArgument`.
    * ``max_seqlen`` (>= 1): bound on every sequence length, inclusive. Lengths are biased to
      tile edges (1, 63/64/65, 127/128/129, ..., ``2^k +- 1``), with ``seqlen_q != seqlen_k``
      drawn in both directions.
    * ``max_batch`` (>= 1), ``max_heads`` (>= 1), ``max_head_dim`` (>= 8): inclusive bounds.
    * ``features``: subset of :data:`FEATURES` allowed to appear. Each is drawn on or off
      (off shrinks first). Features FA4 lacks for a drawn head dim are switched off.
    * ``distributions``: subset of :data:`~fa4verify.problem.values.DISTRIBUTIONS`.
    * ``max_work``: optional bound on :attr:`AttentionProblem.work`; larger draws are rejected
      with ``assume`` (keep it generous: rejection costs examples).
    * ``head_dim_choices``: only these head dims (an int ``d`` is ``(d, d)``, a pair is
      ``(head_dim, head_dim_v)``; each must be valid on ``arch``; ``max_head_dim`` is then ignored).
    * confinement to a deployment (Note [Confined draws]; each None / empty = drawn as usual):
      ``head_count_choices`` ((nheads, nheads_kv) pairs; ``max_heads`` and the gqa feature are then
      ignored), ``seqlen_q_range`` / ``seqlen_k_range`` ((min, max) of every sequence, the
      maximum clipped to ``max_seqlen`` but never below the minimum; a varlen sequence is empty
      only where its side's minimum is 0),
      ``mask_choices`` (any of "none", "causal", "window") with ``window_choices`` ((left, right)
      windows), ``softcap_choices`` (values, 0 = off), ``sinks`` (always / never),
      ``scale_choices`` (softmax_scale values, None = FA4's default 1/sqrt(hd)), ``sink_dtype``
      (the dtype of a drawn sink; None: fp32 or bf16, drawn). A drawn head
      dim for which FA4's forward lacks every allowed choice (a dedicated SM100 (256, 256) forward,
      FA4 4.0.0b20..b33: no window, softcap or sink) is rejected.
    * call features (opt-in, :data:`~fa4verify.problem.calls.CALL_FEATURES` in ``features``):
      ``"paged_kv"`` / ``"seqused_k"`` (one of them, or neither, per problem: a varlen problem run
      with batched K/V, paged with ``page_sizes`` (-1 = the head dim's tile_n) and a random page
      permutation), ``"block_sparse"`` / ``"mask_mod_fn"`` (dense non-causal problems),
      ``"split_kv"`` (FA4's ``num_splits`` 2..4 on SM 10.x dense problems, under a causal or local
      mask those of one query tile: where fa4verify models FA4's cut of the keys; at hd != hdv FA4
      runs the short draws unsplit, a plain call then).
      NaN in unused pages only with ``hostile_nan=True``.

    Never generates: fp8, MLA head dims, empty dense sequences, NaN/Inf inputs, a mask_mod together
    with causal/window/varlen, or a varlen batch with no query row. Values are exact in ``dtype``.
    Shrinks toward: bf16, batch 1, one head, head dim 8, seqlen 1, no features, standard normal
    values with seed 0.
    """
    check_arch(arch)
    if dtype is not None:
        check_dtype(dtype)
    for name, val, lo in (("max_seqlen", max_seqlen, 1), ("max_batch", max_batch, 1), ("max_heads", max_heads, 1),
                          ("max_head_dim", max_head_dim, 8)):
        if not isinstance(val, int) or val < lo:
            raise InvalidArgument(f"{name}={val!r} must be an int >= {lo}")
    feats = set(features)
    unknown = feats - set(FEATURES) - set(CALL_FEATURES) - {MOD_FEATURE}
    if unknown:
        raise InvalidArgument(f"features={sorted(features)!r}: unknown {sorted(unknown)} "
                              f"(known: {FEATURES + CALL_FEATURES + (MOD_FEATURE,)})")
    for p in page_sizes:
        if not isinstance(p, int) or not (p == -1 or p >= 1):
            raise InvalidArgument(f"page_sizes={tuple(page_sizes)!r}: each must be an int >= 1 (or -1: tile_n)")
    if distributions is not None:
        bad = set(distributions) - set(DISTRIBUTIONS)
        if bad or not distributions:
            raise InvalidArgument(f"distributions={distributions!r}: unknown {sorted(bad)} (known: {DISTRIBUTIONS})")

    if max_work is not None and (seqlen_q_range or seqlen_k_range or head_count_choices):
        # Note [Confined draws]: a deployment whose smallest problem exceeds the size bound has
        # nothing to draw; say so at once instead of rejecting every draw
        hds = [(c, c) if isinstance(c, int) else tuple(c) for c in head_dim_choices or ((8, 8),)]
        smallest = (_clip_range(seqlen_q_range, max_seqlen)[0] * _clip_range(seqlen_k_range, max_seqlen)[0]
                    * min((int(h) for h, _ in head_count_choices or ((1, 1),)))
                    * min(int(a) + int(b) for a, b in hds))
        if smallest > max_work:
            raise InvalidArgument(f"the smallest confined problem (work {smallest:,}: seqlens {seqlen_q_range} x "
                                  f"{seqlen_k_range}, heads {tuple(head_count_choices or ())}) exceeds "
                                  f"max_work={max_work:,}")
    dt = dtype if dtype is not None else draw(st.sampled_from(("bf16", "fp16")))
    hd, hdv = draw(head_dims(arch=arch, max_head_dim=max_head_dim,
                             choices=tuple(head_dim_choices) if head_dim_choices is not None else None))
    feats -= _arch_features(arch, hd, hdv)
    if head_count_choices is not None:
        nheads, nheads_kv = draw(st.sampled_from(sorted((int(h), int(k)) for h, k in head_count_choices)))
    else:
        nheads, nheads_kv = draw(head_counts(max_heads=max_heads, gqa="gqa" in feats))
    batch = draw(st.integers(1, max_batch))
    confined = seqlen_q_range is not None or seqlen_k_range is not None
    qr, kr = _clip_range(seqlen_q_range, max_seqlen), _clip_range(seqlen_k_range, max_seqlen)
    use_varlen = "varlen" in feats and draw(st.booleans())
    if use_varlen:
        sq_list, sk_list = draw(varlen_seqlens(batch=batch, max_seqlen=max_seqlen,
                                               q_range=qr if confined else None, k_range=kr if confined else None))
        sq, sk = max(sq_list), max(sk_list)
    else:
        sq_list = sk_list = None
        if confined:                        # a dense sequence is never empty
            sq, sk = draw(seqlen_pairs(min_seqlen=max(1, qr[0]), max_seqlen=qr[1], min_seqlen_k=max(1, kr[0]),
                                       max_seqlen_k=kr[1]))
        else:
            sq, sk = draw(seqlen_pairs(max_seqlen=max_seqlen))
    # a registered score_mod / mask_mod pair (the mod_pairs feature): about one in three problems,
    # dense or varlen (plain cu_seqlens); no MaskMod pattern, sink or call form with it
    use_mods = (MOD_FEATURE in feats and not sinks
                and draw(st.sampled_from((False, False, True))))
    mm = None
    causal, window = False, (None, None)
    if "mask_mod" in feats and not use_varlen and not use_mods and draw(st.booleans()):
        mm = draw(mask_mods(seqlen_q=sq, seqlen_k=sk))
    elif mask_choices is not None:
        masks = [m for m in ("none", "causal", "window") if m in mask_choices
                 and (m != "window" or "local" in feats)]
        if not masks:
            reject()                        # FA4 has none of the deployment's masks for this head dim
        m = draw(st.sampled_from(masks))
        if m == "causal":
            causal = True
        elif m == "window":
            window = draw(st.sampled_from(sorted((int(a), int(b)) for a, b in window_choices)))
    elif "causal" in feats or "local" in feats:
        causal, window = draw(causal_and_windows(seqlen_q=max(sq, 1), seqlen_k=max(sk, 1),
                                                 local="local" in feats, causal="causal" in feats))
        if "causal" not in feats and resolve_window(causal, window)[0]:
            causal, window = False, (None, None)   # e.g. (None, 0) is causal in FA4's resolution
    if softcap_choices is not None:
        caps = sorted({float(c) for c in softcap_choices if c == 0 or "softcap" in feats})
        if not caps:
            reject()
        softcap = draw(st.sampled_from(caps))
    else:
        softcap = draw(softcaps()) if "softcap" in feats and draw(st.booleans()) else 0.0
    if sinks is not None:
        if sinks and "sink" not in feats:
            reject()
        sink = bool(sinks)
    else:
        sink = "sink" in feats and not use_mods and draw(st.booleans())
    if scale_choices is not None:
        scale = draw(st.sampled_from(tuple(scale_choices)))
    else:
        scale = draw(st.sampled_from((None, None, None, 1.0, 0.0625)))
    if sink and sink_dtype is None:
        sink_dtype = draw(st.sampled_from(("fp32", "bf16")))
    values = draw(value_specs(dtype=dt, distributions=tuple(distributions) if distributions else None, sinks=sink))
    prob = AttentionProblem(arch=arch, dtype=dt, batch=batch, seqlen_q=sq, seqlen_k=sk, nheads=nheads,
                            nheads_kv=nheads_kv, head_dim=hd, head_dim_v=hdv, causal=causal, window_size=window,
                            softcap=softcap, sink=sink, sink_dtype=(sink_dtype or "fp32") if sink else "fp32",
                            softmax_scale=scale, seqlens_q=sq_list, seqlens_k=sk_list,
                            mask_mod=mm, values=values)
    kv = [f for f in ("paged_kv", "seqused_k", "seqused_q") if f in feats]
    keep = "block_sparse" in feats or "mask_mod_fn" in feats
    # Note [Split-KV as a call form]: a dense call where fa4verify models FA4's cut of the keys
    # (targets.split_kv_unmodelled decides; the split count does not change that)
    from fa4verify.targets import split_kv_unmodelled
    split = ("split_kv" in feats and not prob.varlen and mm is None
             and split_kv_unmodelled(prob.replace(call=CallForm(num_splits=2))) is None)
    if use_mods:
        prob = draw(_with_mod_pair(prob, block_sparse="block_sparse" in feats))
    elif kv or keep or split:
        # one call-form family per problem; "plain" first so it shrinks away
        fam = draw(st.sampled_from(["plain"] + kv + (["keep"] if keep else []) + (["split_kv"] if split else [])))
        if fam == "split_kv":
            prob = prob.replace(call=CallForm(num_splits=draw(st.integers(2, 4))))
        if fam in ("paged_kv", "seqused_k"):
            prob = draw(kv_call_forms(prob, paged=fam == "paged_kv", page_sizes=tuple(page_sizes),
                                      hostile_nan=hostile_nan, min_used=kr[0] if confined else 0))
        elif fam == "seqused_q":
            prob = draw(q_call_forms(prob, min_used=qr[0] if confined else 0))
        elif fam == "keep":
            prob = draw(keep_call_forms(prob, block_sparse="block_sparse" in feats,
                                        mask_mod_fn="mask_mod_fn" in feats))
    varlen_sparse = prob.varlen and prob.call is not None and prob.call.block_size is not None
    if "pack_gqa" in feats and prob.nheads > prob.nheads_kv and not varlen_sparse:
        # FA4 packs every GQA forward unless told not to (interface.py: pack_gqa = qhead_per_kvhead > 1)
        prob = with_pack_gqa(prob, draw(st.sampled_from((None, False))))
    if confined and not _in_ranges(prob, qr, kr):
        reject()                            # e.g. a self-attention mod pair's seqlen_k = seqlen_q
    if max_work is not None:
        from hypothesis import assume
        assume(prob.work <= max_work)
    return prob


def _clip_range(r: Optional[tuple[int, int]], max_seqlen: int) -> tuple[int, int]:
    """A deployment's (min, max) sequence range under the draw's ``max_seqlen``: the maximum is
    clipped to it, never below the minimum (the deployment's shortest sequence is still drawn).
    Without a range: empty varlen sequences allowed, as unconfined draws have them."""
    lo, hi = (0, max_seqlen) if r is None else (max(0, int(r[0])), int(r[1]))
    return lo, max(lo, 1, min(hi, max_seqlen))


def _in_ranges(p: AttentionProblem, qr: tuple[int, int], kr: tuple[int, int]) -> bool:
    qs, ks = (p.seqlens_q, p.seqlens_k) if p.varlen else ((p.seqlen_q,), (p.seqlen_k,))
    return all(qr[0] <= x <= qr[1] for x in qs) and all(kr[0] <= x <= kr[1] for x in ks)


# Note [Confined draws]
# ---------------------
# A deployment profile says what a team runs; a fuzz draw for it must lie inside it in every
# dimension the profile names, or a passing audit vouches for shapes the team never runs while
# the team's own shapes go unchecked (issue 26: 0 of 38 draws inside a hd-128, 32/8-head,
# seqlen 4096..8192 profile). The confinement arguments choose among the profile's values (head
# dims and pairs, head counts, masks and windows, softcaps, sinks) instead of switching features
# on and off, and draw every sequence length inside the profile's range. The draw's size bound
# (``max_seqlen``, a CPU budget) clips the range from above but never below its minimum: the
# shortest sequence the deployment runs is drawn even when it is longer than the bound; the
# ``max_work`` bound (the CPU judge's cost) still holds, and a deployment whose smallest problem
# exceeds it is refused by name (InvalidArgument), never drawn outside the profile nor left empty.
# tests/test_deployment_confinement.py checks every shipped profile on the audit's own draw.


@st.composite
def _with_mod_pair(draw: DrawFn, prob: AttentionProblem, block_sparse: bool = False) -> AttentionProblem:
    """``prob`` with one registered score_mod / mask_mod pair (the ``mod_pairs`` feature of
    :func:`attention_problems`), under the same constraints as :func:`mod_problems`: a mask pair
    drops causal and the window (FA4 ignores them with a mask_mod), a score pair drops softcap,
    a self-attention pair gets ``seqlen_k = seqlen_q`` (varlen: every sequence square). ``block_sparse``:
    a mask pair of a dense problem may come with block sparsity whose mask blocks it decides (Note
    [Partial blocks])."""
    from fa4verify import mods as _mods
    names = _mods.names()
    if not names:
        return prob
    name = draw(st.sampled_from(names))
    pair = _mods.get(name)
    sk = prob.seqlen_q if pair.self_attention_only else prob.seqlen_k
    sks = prob.seqlens_q if pair.self_attention_only and prob.varlen else prob.seqlens_k
    causal = bool(prob.causal) and pair.kind == "score" and prob.window_size == (None, None)
    out = prob.replace(seqlen_k=sk, seqlens_k=sks, causal=causal, window_size=(None, None), softcap=0.0,
                       mods=(name,), mod_seed=draw(st.integers(0, 3)))
    if block_sparse and pair.kind == "mask" and not out.varlen and draw(st.booleans()):
        from fa4verify.coverage.cases import sparse_block_size
        out = out.replace(call=CallForm(
            block_size=sparse_block_size(out.arch, out.head_dim, out.head_dim_v),
            block_seed=draw(st.integers(0, 2 ** 16)), block_keep=draw(st.sampled_from((0.75, 1.0, 0.5))),
            block_partial=draw(st.sampled_from((0.5, 1.0, 0.25)))))
    return out


@st.composite
def mod_problems(draw: DrawFn, *, mods: Optional[Collection[str]] = None, arch: str = "sm90",
                 dtype: Optional[str] = None, max_seqlen: int = 256, max_batch: int = 2, max_heads: int = 4,
                 max_head_dim: int = 128, distributions: Optional[Collection[str]] = None,
                 head_dim_choices: Optional[Collection[Any]] = None,
                 head_count_choices: Optional[Collection[tuple[int, int]]] = None,
                 seqlen_q_range: Optional[tuple[int, int]] = None,
                 seqlen_k_range: Optional[tuple[int, int]] = None) -> AttentionProblem:
    """Draw a dense :class:`AttentionProblem` with one registered score_mod / mask_mod pair
    (``fa4verify.mods``; ``mods``: the names to draw from, default every registered pair, yours
    included). Score pairs may come with causal masking (FA4 keeps it with a score_mod); mask
    pairs never (FA4 drops causal and windows with a mask_mod). Pairs that need
    ``seqlen_q == seqlen_k`` get it. The aux tensors come from the pair's factory at the drawn
    ``mod_seed`` (0..3). Never generates: varlen, softcap, sinks, MaskMod patterns. The head dims,
    head counts and sequence ranges confine the draw as in :func:`attention_problems`. Shrinks
    toward the first name in sorted order, then as :func:`attention_problems`."""
    from fa4verify import mods as _mods
    names = sorted(mods) if mods is not None else _mods.names()
    if not names:
        raise InvalidArgument("mods: no pair names to draw from")
    for n in names:
        _mods.get(n)                       # unknown names fail here, with the registry's message
    name = draw(st.sampled_from(names))
    pair = _mods.get(name)
    feats = {"gqa"} | ({"causal"} if pair.kind == "score" else set())
    base = draw(attention_problems(arch=arch, dtype=dtype, max_seqlen=max_seqlen, max_batch=max_batch,
                                   max_heads=max_heads, max_head_dim=max_head_dim, features=feats,
                                   distributions=distributions, head_dim_choices=head_dim_choices,
                                   head_count_choices=head_count_choices, seqlen_q_range=seqlen_q_range,
                                   seqlen_k_range=seqlen_k_range))
    sk = base.seqlen_q if pair.self_attention_only else base.seqlen_k
    if seqlen_k_range is not None and not seqlen_k_range[0] <= sk <= seqlen_k_range[1]:
        reject()
    causal = bool(base.causal) and pair.kind == "score"
    return base.replace(seqlen_k=sk, causal=causal, window_size=(None, None), mods=(name,),
                        mod_seed=draw(st.integers(0, 3)))


def sibling_key(problem: AttentionProblem) -> str:
    """What a sibling keeps of its problem (:func:`problem_groups`): everything but the values
    and, for a varlen problem with the plain call, the per-sequence lengths. Equal keys in a row
    of a drawn campaign are one group."""
    d = problem.to_dict()
    d.pop("values", None)
    if problem.varlen and problem.call is None:
        d.pop("seqlens_q", None)
        d.pop("seqlens_k", None)
    return json.dumps(d, sort_keys=True)


@st.composite
def problem_groups(draw: DrawFn, problems: st.SearchStrategy[AttentionProblem], *, siblings: int,
                   distributions: Optional[Collection[str]] = None,
                   max_work: Optional[int] = None, seqlen_q_range: Optional[tuple[int, int]] = None,
                   seqlen_k_range: Optional[tuple[int, int]] = None) -> list[AttentionProblem]:
    """A drawn problem followed by ``siblings`` problems that run the same FA4 kernels with other
    inputs (Note [Siblings share compile keys]).

    Each sibling has its own :class:`ValueSpec` (distribution, parameters and seed drawn as by
    :func:`value_specs`); a varlen problem's siblings also get new per-sequence lengths, tile-edge
    biased in ``[0, max]``, with the batch's maxima kept (FA4 compiles for the maxima, never for
    the lengths: cu_seqlens are run-time data), unless they would exceed ``max_work`` (the bound
    :func:`attention_problems` drew under): then the sibling keeps the lengths; with
    ``seqlen_q_range`` / ``seqlen_k_range`` (a deployment's) they stay inside them. Everything
    else -- head dims, head counts, masks, softcap, sink, scale, call form, mods -- is the drawn
    problem's.

    Note [Siblings share compile keys]: a production fuzz example costs FA4 compiles (1 to 4 s each
    on the H200, measured) for every kernel it is the first to need; a campaign of distinct draws
    compiled 80 kernels for 50 examples (session 7). What selects FA4's kernel is the key built
    in ``flash_attn.cute.interface`` from dtypes, head dims, flags, tiles and, through heuristics
    (split-KV, single-block backward), the maximal sequence lengths -- not the input values and
    not the lengths of a varlen batch below its maxima. A sibling keeps every one of those, so it
    reuses its group's kernels: the audit measures it (``example_kernels`` in the fuzz result,
    Note [Compile keys in the timeline]) rather than trusting this model. A sibling that compiles
    anyway is only slower, never less checked: every example is judged in full.
    """
    from fa4verify._strategies.shapes import seqlen_edges
    if siblings < 0:
        raise InvalidArgument(f"siblings={siblings} must be >= 0")
    p = draw(problems)
    out = [p]
    for _ in range(siblings):
        q = p.replace(values=draw(value_specs(dtype=p.dtype, distributions=tuple(distributions) if distributions
                                               else None, sinks=p.sink)))
        if p.varlen and p.call is None and p.batch > 1:
            lens = []
            for m, rng in ((p.seqlen_q, seqlen_q_range), (p.seqlen_k, seqlen_k_range)):
                if rng is not None:                # inside the deployment's range (0: empty allowed)
                    edges = (seqlen_edges(m, min_seqlen=min(max(1, int(rng[0])), m)) or (m,)) if m >= 1 else (0,)
                    edges = ((0,) if int(rng[0]) == 0 and m >= 1 else ()) + edges
                else:
                    edges = (0,) + seqlen_edges(m) if m >= 1 else (0,)
                xs = [draw(st.sampled_from(edges)) for _ in range(p.batch)]
                xs[draw(st.integers(0, p.batch - 1))] = m     # the maximum stays: the same kernel
                lens.append(tuple(xs))
            try:
                r = q.replace(seqlens_q=lens[0], seqlens_k=lens[1])
            except ValueError:
                r = q                      # lengths this problem cannot take: the values only
            if max_work is None or r.work <= max_work:
                q = r
        out.append(q)
    return out
