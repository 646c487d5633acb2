"""Coverage by construction (issue 26, CPU must-shows): the plan the audit's coverage checks run
covers every supported value pair and every supported mask x call form x pass triple, its rows
become problems that hold the row's values, and a plan that lacks a value makes the check name
the hole and go undecided, never pass.

The supported tuples are enumerated here from the feature space's support predicate
(``FeatureSpace.why_not`` / ``no_backward`` / ``passes``) and looked up in the rows directly; the
planner's own bookkeeping (``required_tuples``, ``coverage``) is not used to decide them.
"""
from __future__ import annotations

import itertools

import pytest

from fa4verify.kernels import facts

from fa4verify.audit import registry
from fa4verify.checks import coverage as C
from fa4verify.coverage import planner
from fa4verify.coverage.space import DIMENSIONS, FORMS, MASKS, PASSES
from fa4verify.deployment import Deployment
from fa4verify.run.engine import run_here
from fa4verify.targets import TwinTarget, production_features

ARCHS = ("sm90", "sm100")


def _build(arch, features, deployment=None, seed=0):
    ctx = registry.CheckContext(arch=arch, seed=seed, profile="full", check_id=f"coverage.twin[{arch}]",
                                deployment=deployment.to_dict() if deployment is not None else None)
    return C.build(ctx, arch=arch, dtype="bf16", features=features)


def _realises(sp, row, p) -> list[str]:
    """What of ``row`` the problem ``p`` does not hold (empty: the problem is the row)."""
    from fa4verify.kernels.facts import fwd_tile
    bad = []
    if (p.head_dim, p.head_dim_v) != sp.hd[row["hd"]]:
        bad.append("hd")
    ratio = p.nheads // p.nheads_kv
    if row["gqa"] in sp.heads:
        if (p.nheads, p.nheads_kv) != sp.heads[row["gqa"]]:
            bad.append("gqa")
    elif not (p.nheads_kv == 1 < p.nheads if row["gqa"] == "mqa" else ratio == int(row["gqa"].split("_")[0])):
        bad.append("gqa")
    unpacked = p.call is not None and p.call.pack_gqa is False
    if unpacked != row["gqa"].endswith("_unpacked"):
        bad.append("pack_gqa")
    wl, wr = p.window_size
    want = {"none": (False, False, False), "causal": (True, False, False), "left": (False, True, False),
            "right": (False, False, True), "both": (False, True, True), "causal_left": (True, True, False)}
    if row["mask"] in sp.windows:
        if (p.causal, (wl, wr)) != (False, sp.windows[row["mask"]]):
            bad.append("mask")
    elif (p.causal, wl is not None, wr is not None) != want[row["mask"]]:
        bad.append("mask")
    c = p.call
    splits = c is not None and c.num_splits > 1
    if c is not None and not c.rearranges:
        c = None                                      # pack_gqa alone moves no array
    form = row["form"]
    got = ("split_kv" if splits and not p.varlen and not p.mods else
           "dense" if c is None and not p.varlen and not p.mods else
           "varlen" if c is None and p.varlen and not p.mods else
           "block_sparse_mod" if c is not None and c.block_size and c.block_partial and p.mods
           and p.mod_pairs()[1] is not None else
           "block_sparse_varlen" if c is not None and c.block_size and p.varlen and not c.batched_layout else
           "score_mod" if p.mods and p.mod_pairs()[0] is not None else
           "mask_mod" if p.mods or (c is not None and c.mask_mod_fn) else
           "block_sparse" if c.block_size else
           "seqused_q" if c.seqused_q and not c.seqused_k and len(set(p.seqlens_k)) == 1 else
           "seqused_k" if c.page_size is None and not c.seqused_q else
           "paged_small" if c.page_size == 16 else "paged_tile")
    if form in sp.pages:
        ok = c is not None and c.page_size == sp.pages[form]
    elif form == "paged_tile":
        tn = fwd_tile(sp.arch, sp.dtype, p.head_dim, p.head_dim_v, p.causal and not p.local, p.local)[1]
        ok = got == form and c.page_size == tn
    else:
        ok = got == form
    if not ok:
        bad.append("form")
    lens = (p.seqlens_q + p.seqlens_k) if p.varlen else (p.seqlen_q, p.seqlen_k)
    sl = row["seqlen"]
    tn = fwd_tile(sp.arch, sp.dtype, p.head_dim, p.head_dim_v, p.causal and not p.local, p.local)[1]
    if splits and sl not in sp.lengths:       # a split row: the class's keys and two more KV tiles
        p = p.replace(seqlen_k=p.seqlen_k - 2 * tn, seqlen_q=p.seqlen_q - (2 * tn if sl == "q_gt_k" else 0))
        if p.head_dim != p.head_dim_v:        # and at hd != hdv 64 more (FA4 splits it only then)
            from fa4verify.coverage.cases import SPLIT_KV_DIFF_HD_TILES
            p = p.replace(seqlen_k=p.seqlen_k - SPLIT_KV_DIFF_HD_TILES * tn)
    if sl in sp.lengths:
        ok = (p.seqlen_q, p.seqlen_k) == sp.lengths[sl]
    else:
        ok = {"zero": 0 in lens, "q_gt_k": p.seqlen_q > p.seqlen_k, "q_lt_k": p.seqlen_q < p.seqlen_k,
              "eq_tile": p.seqlen_k == tn, "tile_m1": p.seqlen_k == tn - 1, "tile_p1": p.seqlen_k == tn + 1,
              "lt_tile": p.seqlen_k < tn, "multi": p.seqlen_k > 2 * tn,
              "many": p.varlen and len(p.seqlens_q) > facts.varlen_batch_search_threshold()}[sl]
    if not ok:
        bad.append("seqlen")
    if (p.softcap > 0) != (row["softcap"] != "off") or (row["softcap"] in sp.softcaps
                                                        and p.softcap != sp.softcaps[row["softcap"]]):
        bad.append("softcap")
    if p.sink != (row["sink"] != "off") or (p.sink and p.sink_dtype != row["sink"]):
        bad.append("sink")
    want_scale = sp.scales.get(row["scale"], 1.0 / p.head_dim if row["scale"] == "custom" else None)
    if p.softmax_scale != want_scale:
        bad.append("scale")
    if p.values.distribution != row["values"]:
        bad.append("values")
    return bad


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("target", ["twin", "production"])
def test_the_plan_covers_every_supported_pair_and_mask_form_pass_triple(arch, target):
    feats = TwinTarget().features() if target == "twin" else production_features()
    sp, pl, problems = _build(arch, feats)
    rows = pl.rows
    assert rows and not pl.uncoverable
    assert set(sp.values["mask"]) == set(MASKS) and set(sp.values["form"]) <= set(FORMS)
    if target == "twin":      # the twin runs every call form but the mod pairs' (production only)
        assert set(sp.values["form"]) == set(FORMS) - {"score_mod", "block_sparse_mod"}
    else:
        assert set(sp.values["form"]) == set(FORMS)
    for r in rows:
        assert sp.why_not(r) is None, r
    dims = [d for d in DIMENSIONS if d in sp.values]
    supported = missing = 0
    for a, b in itertools.combinations(dims, 2):
        for va, vb in itertools.product(sp.values[a], sp.values[b]):
            if sp.why_not({a: va, b: vb}) is not None:
                continue
            supported += 1
            if not any(r[a] == va and r[b] == vb for r in rows):
                missing += 1
                pytest.fail(f"{arch} {target}: supported pair {a}={va}, {b}={vb} is in no planned row")
    triples = 0
    for a, b in (("mask", "form"), ("gqa", "scale")):
        for va, vb, ps in itertools.product(sp.values[a], sp.values[b], PASSES):
            part = {a: va, b: vb}
            if sp.why_not(part) is not None or (ps == "bwd" and sp.no_backward(part) is not None):
                continue
            triples += 1
            assert any(r[a] == va and r[b] == vb and ps in sp.passes(r) for r in rows), \
                f"{arch} {target}: supported triple {a}={va}, {b}={vb}, pass={ps} is in no planned row"
    # a GQA backward with a custom softmax_scale (the dK postprocess scales dK) is planned
    assert any(r["gqa"] not in ("1",) and r["scale"] == "custom" and "bwd" in sp.passes(r) for r in rows)
    # the space is not trivial: most pairs and triples are supported, and the backward is planned
    assert supported > 500 and triples > 30 and missing == 0
    assert any("bwd" in sp.passes(r) for r in rows)
    # every registered pair runs; a row that claims the backward runs a pair that has one (a
    # forward-only pair is on a copy of a row whose own pair has one)
    for form, names in (("score_mod", sp.score_pairs), ("mask_mod", sp.mask_pairs)):
        if form in sp.values["form"]:
            assert {r.get("pair") for r in rows if r["form"] == form} == set(names), form

    def strip(r):
        return {k: v for k, v in r.items() if k != "pair"}
    for r in rows:
        if r["form"] == "mask_mod" and "bwd" in sp.passes(r) and r["pair"] not in sp.mask_pairs_bwd:
            assert any(strip(o) == strip(r) and o["pair"] in sp.mask_pairs_bwd for o in rows), r
    # every planned row becomes a problem that holds its values
    for i, (r, p) in enumerate(zip(rows, problems)):
        assert _realises(sp, r, p) == [], (i, r, p.describe())
    # deterministic per seed, and another seed is another plan of the same coverage
    assert _build(arch, feats)[1].rows == rows


@pytest.mark.parametrize("drop", [("hd", "32"), ("mask", "causal"), ("values", "edges")])
def test_a_value_missing_from_the_plan_is_named_as_a_hole_and_undecided(monkeypatch, drop):
    """The coverage check (coverage.twin, run on the CPU twin) on a plan with every row of one
    value removed: the check names the uncovered tuples of that value and is undecided; the
    same check on the whole plan passes with no hole (so the hole is the removal's)."""
    dim, val = drop
    dep = Deployment.from_mapping({"name": "tiny", "head_dims": [16, 32], "nheads": 2, "nheads_kv": 1,
                                   "masks": ["none", "causal"], "seqlen_q": [1, 70], "seqlen_k": [1, 70],
                                   "distributions": ["normal"]}, "<test>")
    ctx = registry.CheckContext(arch="sm90", seed=0, profile="full", check_id="coverage.twin[sm90]",
                                deployment=dep.to_dict())
    whole = run_here(C.twin.__fa4verify_check__, ctx)
    assert whole.status == "pass", whole.summary
    cov = whole.details["plan_coverage"]
    assert cov["holes"] == [] and cov["covered"] == cov["supported"] > 50
    assert any(r[dim] == val for r in whole.details["plan"]["row_values"])

    real_plan = planner.plan

    def without(space, **kw):
        pl = real_plan(space, **kw)
        pl.rows = [r for r in pl.rows if r[dim] != val]
        return pl

    monkeypatch.setattr(planner, "plan", without)
    r = run_here(C.twin.__fa4verify_check__, ctx)
    assert r.status == "undecided", r.summary
    cov = r.details["plan_coverage"]
    named = f"{dim}={val}"
    # every supported pair of the missing value is a hole, by name (other pairs that only the
    # removed rows held are holes too)
    from fa4verify.coverage.space import FeatureSpace
    sp = FeatureSpace.from_dict(r.details["plan"]["space"])
    of_value = {", ".join(f"{d}={v}" for d, v in sorted({dim: val, other: w}.items()))
                for other in sp.values if other != dim for w in sp.values[other]
                if sp.why_not({dim: val, other: w}) is None}
    assert len(of_value) > 5 and of_value <= set(cov["holes"])
    assert cov["covered"] < cov["supported"] and r.metrics["coverage_holes"] == len(cov["holes"])
    assert f"{len(cov['holes'])} HOLE(S), first: {cov['holes'][0]}" in r.summary
    if dim == "mask":         # the triple of the missing mask, by name
        assert "form=dense, mask=causal, pass=bwd" in cov["holes"]


@pytest.mark.parametrize("arch", ARCHS)
def test_split_kv_is_planned_where_fa4verify_models_fa4s_cut(arch):
    """FA4's split-KV forward (``num_splits > 1``): on SM90 every tuple with it is reported not
    planned with FA4's refusal; on SM 10.x it is planned, forward-only, at every supported value
    of the other dimensions (masked rows as one query tile), and its tuples that need several
    query tiles under a mask (FA4 cuts each tile's own range) are reported not planned by name; an
    hd != hdv row runs FA4's own split (64-key tiles, its heuristic's count: more than one split)."""
    sp, pl, problems = _build(arch, production_features())
    assert "split_kv" in sp.values["form"]
    rows = [(r, p) for r, p in zip(pl.rows, problems) if r["form"] == "split_kv"]
    whys = {w for t, w in pl.unsupported.items() if ("form", "split_kv") in t}
    assert sp.no_backward({"form": "split_kv"}) is not None          # FA4's split-KV is forward-only
    if arch == "sm90":
        assert not rows and whys and all("FA4 has no split-KV forward" in w for w in whys), whys
        assert not any(("form", "split_kv") in t for t in pl.required)
        return
    assert rows
    for r, p in rows:
        assert p.call.num_splits in (2, 3)
        from fa4verify.targets import split_kv_runs, split_kv_tile
        assert split_kv_runs(p), r            # FA4 runs every planned split row split
        if p.head_dim != p.head_dim_v:        # FA4's own 64-key tiles and split count
            assert split_kv_tile(p) == 64 and p.batch == 1, r
        if p.causal or p.local:            # one query tile (packed heads counted)
            assert p.seqlen_q * (p.nheads // p.nheads_kv) <= facts.SPLIT_KV_ONE_TILE_ROWS
        # FA4's combine merges at least two splits holding keys on every planned row
        from fa4verify.targets import split_kv_ranges
        ranges = split_kv_ranges(p)
        assert sum(k1 > k0 for k0, k1 in ranges) >= 2, (r, ranges)
    for seed in (1, 2, 3):                # not one seed's luck
        sp2, pl2, problems2 = _build(arch, production_features(), seed=seed)
        for r, p in zip(pl2.rows, problems2):
            if r["form"] == "split_kv":
                from fa4verify.targets import split_kv_ranges
                assert sum(k1 > k0 for k0, k1 in split_kv_ranges(p)) >= 2, (seed, r)
    assert sp.why_not({"form": "split_kv", "mask": "causal"}) is None
    assert any(r["mask"] != "none" for r, _ in rows)
    assert "one query tile" in sp.why_not({"form": "split_kv", "mask": "causal", "seqlen": "q_gt_k"})
    assert "one query tile" in sp.why_not({"form": "split_kv", "mask": "left", "seqlen": "q_gt_k"})
    assert sp.why_not({"form": "split_kv", "mask": "none", "seqlen": "q_gt_k"}) is None
    assert sp.why_not({"form": "split_kv", "hd": "192x128"}) is None
    assert "keeps one split" in sp.why_not({"form": "split_kv", "hd": "192x128", "seqlen": "q_gt_k"})
    assert any(p.head_dim != p.head_dim_v for _, p in rows)
    for d in ("hd", "gqa", "seqlen", "softcap", "sink", "scale", "values"):
        for v in sp.values[d]:
            if sp.why_not({"form": "split_kv", d: v}) is None:
                assert any(r[d] == v for r, _ in rows), (d, v)


def test_a_refused_form_is_never_another_tuples_reason():
    """A space whose only other form cannot hold a tuple (dense and a zero-length sequence): the
    reason is dense's, not that of split_kv (which FA4 refuses on SM90)."""
    from fa4verify.coverage.space import space_for
    sp = space_for("sm90", "bf16", forms=("dense", "split_kv"))
    _req, uns = planner.required_tuples(sp)
    why = {w for t, w in uns.items() if ("seqlen", "zero") in t and ("form", "split_kv") not in t}
    assert why and not any("split" in w for w in why), why
