"""Deployment profiles confine what the audit runs (issue 26, CPU must-show): with
``--deployment <profile>`` every problem the fuzz checks draw and every problem the coverage plan
runs lies inside the profile -- head dims and (hd, hdv) pairs, head counts and the GQA ratio,
the sequence-length range (minimum and maximum, per sequence of a varlen batch), the masks and
window sizes, the softcap values, the softmax_scale values, sinks, the call forms, the archs, the dtype and the value
recipes. Checked for every shipped profile, on the code paths of the audit's own checks
(``fa4verify.checks.fuzz._deployment_kw`` + ``fa4verify.fuzz.drawn.draw_problems``;
``fa4verify.checks.coverage.build``)."""
from __future__ import annotations

import pytest

from fa4verify import deployment as D
from fa4verify.audit import registry
from fa4verify.kernels import facts

SHIPPED = sorted(D.shipped())
#: a profile with what no shipped one has: an (hd, hdv) pair, two head counts, a sequence minimum
#: above 1 on each side, two windows, a softcap value, two softmax_scale values, seqused_k, seqused_q
#: and pack_gqa=False
CUSTOM = {"name": "custom", "head_dims": [[192, 128], 64], "nheads": [4, 8], "nheads_kv": 2,
          "masks": ["none", "window"], "window_sizes": [[32, 0], [7, 5]], "softcap": [0.0, 15.0],
          "softmax_scales": [0.0625, 0.1],
          "varlen": True, "seqlen_q": [5, 100], "seqlen_k": [9, 200], "features": ["seqused_k", "seqused_q", "pack_gqa"],
          "distributions": ["normal", "tiny"]}
PROFILES = SHIPPED + ["custom"]


def _load(name):
    return D.Deployment.from_mapping(CUSTOM, "<custom>") if name == "custom" else D.load(name)


def outside(p, dep: D.Deployment, *, planned: bool = False) -> list[str]:
    """What of problem ``p`` lies outside ``dep`` (empty: inside). ``planned``: the coverage
    plan's "edges" value recipe is allowed (the mask-edge probe, Note [Edge values])."""
    bad = []
    if p.arch not in dep.archs:
        bad.append(f"arch {p.arch}")
    if p.dtype not in dep.dtypes:
        bad.append(f"dtype {p.dtype}")
    if (p.head_dim, p.head_dim_v) not in dep.head_dims:
        bad.append(f"head dims {(p.head_dim, p.head_dim_v)}")
    if p.nheads not in dep.nheads or p.nheads_kv not in dep.nheads_kv:
        bad.append(f"heads {p.nheads}/{p.nheads_kv}")
    if p.varlen:
        qs, ks = p.seqlens_q, p.seqlens_k
    else:
        qs, ks = (p.seqlen_q,), (p.seqlen_k,)
    (ql, qh), (kl, kh) = dep.seqlen_q, dep.seqlen_k
    if not all(ql <= x <= qh for x in qs) or not all(kl <= x <= kh for x in ks):
        bad.append(f"seqlens q={list(qs)} k={list(ks)}")
    c = p.call
    mods = p.mod_pairs() if p.mods else (None, None)
    mask_replaced = mods[1] is not None or (c is not None and (c.block_size or c.mask_mod_fn))
    causal, local, left, right = facts.resolve_causal_local_window(p.causal, p.window_size)
    if not mask_replaced:
        if local:
            wins = {facts.resolve_causal_local_window(False, w)[2:] for w in dep.window_sizes}
            if "window" not in dep.masks or (left, right) not in wins:
                bad.append(f"window {p.window_size} (causal={p.causal})")
        elif ("causal" if causal else "none") not in dep.masks:
            bad.append("causal" if causal else "no mask")
    if p.mask_mod is not None:
        bad.append("a MaskMod pattern")
    if p.softcap not in dep.softcap:
        bad.append(f"softcap {p.softcap}")
    if p.sink != dep.sinks or (p.sink and p.sink_dtype != dep.sink_dtype):
        bad.append(f"sink={p.sink} ({p.sink_dtype})")
    if p.softmax_scale not in (dep.softmax_scales or (None,)):
        bad.append(f"softmax_scale {p.softmax_scale}")
    feats = set(dep.features)
    if p.mods and "mod_pairs" not in feats:
        bad.append(f"mods {p.mods}")
    if c is not None:
        if c.page_size is not None:
            if "paged_kv" not in feats or (dep.page_sizes and c.page_size not in dep.page_sizes):
                bad.append(f"paged KV, page {c.page_size}")
            if c.hostile_nan and not dep.nan_pages:
                bad.append("NaN pages")
        elif c.seqused_k and "seqused_k" not in feats:
            bad.append("seqused_k")
        if c.block_size and "block_sparse" not in feats:
            bad.append("block sparsity")
        if c.mask_mod_fn and "mask_mod_fn" not in feats:
            bad.append(f"mask_mod {c.mask_mod_fn}")
    elif p.varlen and not dep.varlen:
        bad.append("varlen")
    recipes = set(dep.distributions or ()) | ({"edges"} if planned else set())
    if dep.distributions and p.values.distribution not in recipes:
        bad.append(f"values {p.values.distribution}")
    return bad


def _ctx(dep, arch, profile="default"):
    return registry.CheckContext(arch=arch, seed=0, profile=profile, check_id="x", deployment=dep.to_dict())


def _archs(dep):
    return [a for a in ("sm90", "sm100") if a in dep.archs]


@pytest.mark.parametrize("name", PROFILES)
def test_every_planned_problem_lies_inside_the_profile(name):
    from fa4verify.checks.coverage import build
    from fa4verify.targets import TwinTarget, production_features
    dep = _load(name)
    n = 0
    for arch in _archs(dep):
        for feats in (TwinTarget().features(), production_features()):
            sp, pl, problems = build(_ctx(dep, arch), arch=arch, dtype=dep.dtypes[0], features=feats)
            assert not pl.uncoverable
            for p in problems:
                assert outside(p, dep, planned=True) == [], p.describe()
            n += len(problems)
            empty_k = [p for p in problems if p.varlen and 0 in p.seqlens_k]
            # a minimum of 0 (decode-paged) plans empty KV sequences, and only then
            assert bool(empty_k) == (dep.seqlen_k[0] == 0), [p.describe() for p in empty_k]
    assert n > 0


@pytest.mark.parametrize("name", PROFILES)
def test_every_drawn_fuzz_problem_lies_inside_the_profile(name):
    """The draws of fuzz.twin (default profile) and fuzz.production (default profile: siblings,
    the head-dim palette the deployment replaces), drawn here in-process (``draw_problems``'
    own function, without the fresh process the audit uses for seed stability)."""
    from fa4verify.checks import fuzz as F
    from fa4verify.fuzz import drawn
    from fa4verify.targets import TwinTarget, production_features

    class Production:      # what the draw asks of the target (no GPU here)
        name = "production"

        def features(self):
            return production_features()
    dep = _load(name)
    n = 0
    seen: set = set()
    for arch in _archs(dep):
        ctx = _ctx(dep, arch)
        runs = [(TwinTarget(), F._deployment_kw(ctx, {}), 0),
                (Production(), F._deployment_kw(ctx, {"max_head_dim": 256,
                                                           "head_dim_choices": F.head_dim_palette(arch, 0)},
                                                      call_features=True), F._siblings(ctx))]
        for target, kw, sib in runs:
            problems = drawn.draw_problems(arch=arch, dtype=dep.dtypes[0], examples=16, seed=0,
                                           profile=F._profile(ctx), target=target, siblings=sib,
                                           fresh_process=False, **kw)
            assert len(problems) >= 8, (target.name, len(problems))
            for p in problems:
                assert outside(p, dep) == [], (target.name, p.describe())
                seen |= {(p.head_dim, p.head_dim_v), (p.nheads, p.nheads_kv), p.window_size, p.softcap,
                         ("scale", p.softmax_scale)}
                if p.varlen and 0 in p.seqlens_k:
                    seen.add("empty kv")
            n += len(problems)
    assert n > 0
    assert ("empty kv" in seen) == (dep.seqlen_k[0] == 0)     # decode-paged: empty KV sequences drawn
    if name == "custom":     # the draws choose among the profile's values, not one of them
        assert {(192, 128), (64, 64), (4, 2), (8, 2), (32, 0), (7, 5), 15.0, ("scale", 0.0625),
                ("scale", 0.1)} <= seen, seen


def test_the_profile_check_sees_what_lies_outside():
    """The predicate above can fail: a problem outside llama3-8b in each dimension is named."""
    from fa4verify.problem import AttentionProblem, ValueSpec
    dep = D.load("llama3-8b")
    ok = AttentionProblem("sm90", "bf16", 1, 64, 64, 32, 8, 128, 128, causal=True)
    assert outside(ok, dep) == []
    for change, word in [(dict(head_dim=64, head_dim_v=64), "head dims"), (dict(nheads=8), "heads"),
                         (dict(nheads_kv=32), "heads"), (dict(seqlen_q=9000), "seqlens"),
                         (dict(causal=False), "no mask"), (dict(causal=False, window_size=(7, 0)), "window"),
                         (dict(softcap=30.0), "softcap"), (dict(sink=True), "sink"),
                         (dict(softmax_scale=0.0625), "softmax_scale"), (dict(values=ValueSpec("huge", 0)), "values"), (dict(dtype="fp16"), "dtype")]:
        got = outside(ok.replace(**change), dep)
        assert any(g.startswith(word) for g in got), (change, got)


# ------------------------------------------------------------------ archs and empty profiles
def _profile(tmp_path, **kw):
    lines = [f'name = "{kw.pop("name", "p")}"', 'description = "test profile"']
    for k, v in kw.items():
        lines.append(f"{k} = {v}")
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_audit_checks_only_the_archs_where_the_profile_holds_something(tmp_path):
    """Note [An empty deployment runs nothing]: the audited archs (the CPU twins here) are the
    deployment's archs where its space holds something FA4 supports."""
    from fa4verify._options import build_config
    assert build_config(device="cpu").archs == ("sm90", "sm100")
    assert build_config(device="cpu", deployment="llama3-8b").archs == ("sm90", "sm100")
    assert build_config(device="cpu", deployment=_profile(tmp_path, archs='["sm90"]')).archs == ("sm90",)
    # SM100 has no head dim 200: only the SM90 twin is audited
    assert build_config(device="cpu", deployment=_profile(tmp_path, head_dims="[200]")).archs == ("sm90",)
    for kw in (dict(archs='["sm103"]'), dict(head_dims="[264]"), dict(head_dims="[200]", archs='["sm100"]')):
        assert build_config(device="cpu", deployment=_profile(tmp_path, **kw)).archs == (), kw
    d = D.load(_profile(tmp_path, head_dims="[264]"))
    assert "0 supported" in d.nothing_supported("sm90", "bf16")
    # hd 256 with a window on SM100: FA4's (generic) forward takes it, its dedicated backward does not
    hd256_window = dict(head_dims="[256]", masks='["window"]', window_sizes="[[64, 0]]", archs='["sm100"]')
    assert build_config(device="cpu", deployment=_profile(tmp_path, **hd256_window)).archs == ("sm100",)


def test_a_profile_that_holds_nothing_fa4_supports_is_nothing_ran_never_a_pass(tmp_path):
    """hd 192/128 causal on SM103 only, seqlen 2^24: nothing of it is audited on this machine's
    twins (SM90, SM100), so every check skips: exit 5, not PASSED."""
    import subprocess
    import sys
    path = _profile(tmp_path, name="nothing", head_dims="[[192, 128]]", masks='["causal"]', archs='["sm103"]',
                    seqlen_q="[16777216, 16777216]", seqlen_k="[16777216, 16777216]")
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--profile", "quick", "--device", "cpu",
                        "--deployment", path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 5, r.stdout[-2000:] + r.stderr[-2000:]
    assert "NOTHING RAN" in r.stdout and "PASSED" not in r.stdout
    assert " 0 pass " in r.stdout


def test_a_profile_larger_than_the_campaigns_size_bound_is_refused_by_name():
    """The issue's example profile (hd 128, 32 q / 8 kv heads, seqlen 4096..8192) has no problem
    within the CPU campaign's work bound: the draw says so (the check errors), never an empty or
    an out-of-profile campaign."""
    from fa4verify.checks import fuzz as F
    from fa4verify.fuzz import drawn
    from fa4verify.targets import TwinTarget
    dep = D.Deployment.from_mapping({"name": "long", "head_dims": [128], "nheads": 32, "nheads_kv": 8,
                                     "masks": ["causal"], "seqlen_q": [4096, 8192], "seqlen_k": [4096, 8192]},
                                    "<long>")
    with pytest.raises(ValueError, match=r"no problem inside the campaign's limits can be drawn.*4096"):
        drawn.draw_problems(arch="sm90", dtype="bf16", examples=4, seed=0, profile="ci", target=TwinTarget(),
                            fresh_process=False, **F._deployment_kw(_ctx(dep, "sm90"), {}))


def test_a_head_dim_one_arch_lacks_is_drawn_only_on_the_other(tmp_path):
    """hd 200 runs on SM90 only: the SM100 twin's draw takes the profile's other head dim."""
    from fa4verify.checks import fuzz as F
    from fa4verify.fuzz import drawn
    from fa4verify.targets import TwinTarget
    dep = D.load(_profile(tmp_path, head_dims="[200, 64]", nheads="2", nheads_kv="1"))
    for arch, want in (("sm90", {200, 64}), ("sm100", {64})):
        ps = drawn.draw_problems(arch=arch, dtype="bf16", examples=12, seed=0, profile="ci", target=TwinTarget(),
                                 fresh_process=False, **F._deployment_kw(_ctx(dep, arch), {}))
        assert {p.head_dim for p in ps} == want and all(outside(p, dep) == [] for p in ps)


@pytest.fixture()
def recorded_runs(monkeypatch):
    """The checks run as in the audit, with a stand-in H200 and production target; the example
    runner records the problems it is given instead of running them."""
    import types

    from fa4verify import fuzz, targets
    from fa4verify.fuzz import drawn

    class Production:
        name = "production"

        def features(self):
            return targets.production_features()

        def describe(self):
            return {"target": "production", "where": "stand-in"}

    ran: list = []

    def run_drawn(problems, indices, *, target, **kw):
        ran.extend(problems[j] for j in indices)
        return {"outcomes": [{"index": int(j), "digest": problems[j].digest(), "describe": problems[j].describe(),
                              "known": [], "status": "not_run"} for j in indices],
                "seconds": 0.0, "target": target.describe()}

    monkeypatch.setattr(fuzz, "ProductionTarget", Production)
    monkeypatch.setattr(targets, "ProductionTarget", Production)
    monkeypatch.setattr(drawn, "run_drawn", run_drawn)
    monkeypatch.setattr(registry.CheckContext, "require_gpu", lambda self, note="": types.SimpleNamespace(arch="sm90"))
    monkeypatch.setattr(registry.CheckContext, "where_measured", lambda self: "measured on NVIDIA H200 (sm_90)")
    return ran


@pytest.mark.slow
def test_llama3_8b_every_problem_the_audits_checks_run_lies_inside_it(recorded_runs):
    """``--deployment llama3-8b``: fuzz.twin, fuzz.production (drawn in the fresh process the
    audit uses) and coverage.production / coverage.twin, each check's own function."""
    from fa4verify.checks import coverage as C, fuzz as F
    from fa4verify.run.engine import run_here
    dep = D.load("llama3-8b")
    for check, arch, device in ((F.twin, "sm90", "cpu"), (F.twin, "sm100", "cpu"), (F.production, "sm90", "cuda"),
                                (C.production, "sm90", "cuda"), (C.twin, "sm90", "cpu"), (C.twin, "sm100", "cpu")):
        recorded_runs.clear()
        ctx = registry.CheckContext(arch=arch, device=device, seed=0, profile="default", check_id=check.__name__,
                                    deployment=dep.to_dict())
        run_here(check.__fa4verify_check__, ctx)           # the check's cases, run as the engine runs them
        assert len(recorded_runs) >= 10, (check.__module__, check.__name__, arch)
        for p in recorded_runs:
            assert outside(p, dep, planned=check in (C.production, C.twin)) == [], p.describe()


def test_the_live_checks_take_the_profiles_sink_dtype_and_softmax_scale():
    """The live checks' problems (fa4verify.checks._live) carry a profile's sink dtype and its
    softmax_scale, as the plan and the fuzz do (a bf16-sink model judged with fp32 sinks, or at a
    scale it never runs, would be judged outside its profile)."""
    from fa4verify.checks import _live
    swa = D.load("swa-sink-hd64")
    ps = _live.problems(_ctx(swa, "sm90"), "sm90", "bf16")
    assert ps and all(p.sink and p.sink_dtype == "bf16" and p.softmax_scale is None for p in ps)
    ps = _live.problems(_ctx(_load("custom"), "sm90"), "sm90", "bf16")
    assert ps and all(p.softmax_scale == 0.0625 and outside(p, _load("custom"), planned=True) == []
                      or p.seqlen_q > 100 for p in ps)
    assert all(p.softmax_scale == 0.0625 for p in ps)


def test_an_fp16_sink_profile_plans_fp16_sinks():
    """A profile may ship fp16 sinks (the plan's own sink values are off / fp32 / bf16): its space
    holds them, never an empty dimension (which would read as "nothing FA4 supports")."""
    from fa4verify.coverage.space import space_for
    dep = D.Deployment.from_mapping({"name": "f16", "sinks": True, "sink_dtype": "fp16"}, "<f16>")
    assert dep.nothing_supported("sm90", "bf16") is None
    sp = space_for("sm90", "bf16", deployment=dep, score_pairs=(), mask_pairs=(), mask_pairs_bwd=())
    assert sp.values["sink"] == ("fp16",)
    from fa4verify.checks.coverage import build
    from fa4verify.targets import TwinTarget
    _, _, problems = build(_ctx(dep, "sm90"), arch="sm90", dtype="bf16", features=TwinTarget().features())
    assert problems and all(p.sink and p.sink_dtype == "fp16" for p in problems if p.values.distribution != "edges")
