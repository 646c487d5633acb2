"""Note [Known issues with a model] (fa4verify/fuzz/defect_models.py): a known issue with a model
absorbs a gradient violation only where the kernel's values lie within the defect's float64 model.

The model's machinery is checked against the oracle where the defect vanishes (the same mask and
indices forward and backward: the model must be the right gradient); the matcher is checked with
kernel values made from the model (absorbed) and from another defect -- red-team round 12's F2
(score_mod_bwd handed head h + offset), a backward masking with the mask pair AND causal -- which
must now be reported, with the elements outside the model named."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.fuzz import defect_models as dm
from fa4verify.fuzz.known_issues import match_known_issue
from fa4verify.fuzz.violation import Violation
from fa4verify.problem import AttentionProblem, CallForm


def _arr(problem):
    return problem.materialize()      # float32 arrays holding exact bf16 values


def _caller_aux(p, a):
    """``a`` with the score pair's aux sized for ``nheads`` (a caller's own data: FA4's SM90 GQA
    backward then reads past it, unknown memory), not for the mapped heads fa4verify builds it for
    (Note [Aux for the mapped heads])."""
    from fa4verify import mods
    pair = p.mod_pairs()[0]
    aux = pair.make_aux(mods.ModShape(p.batch, p.nheads, p.seqlen_q, p.seqlen_k), seed=p.mod_seed,
                        seqlens=mods._seqlens(p))
    return dict(a, mod_aux={pair.name: aux})


def _grads(problem, a, dlse=None):
    ob = judge.oracle_backward(problem, a, dlse=dlse)
    return {n: np.asarray(getattr(ob, n), np.float64) for n in ("dq", "dk", "dv")}


def _close(x, y, rel=1e-9):
    return float(np.max(np.abs(x - y))) <= rel * max(1.0, float(np.max(np.abs(y))))


@pytest.mark.parametrize("mods_, causal, with_dlse", [((), True, False), (("rel_bias",), False, True),
                                                      (("alibi",), True, False), (("document",), False, True)])
def test_the_model_without_a_defect_is_the_oracle(mods_, causal, with_dlse):
    """Forward and backward with the same keep and the same indices: the model's dQ/dK/dV equal the
    oracle's (an independent path: oracles/), with and without a gradient through the LSE."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=24, seqlen_k=31, nheads=4, nheads_kv=2,
                         head_dim=32, head_dim_v=32, mods=mods_, causal=causal and not any(
                             m == "document" for m in mods_))
    a = _arr(p)
    _assert_the_model_is_the_oracle(p, a, np.random.default_rng(1).standard_normal((2, 4, 24)) * 0.5
                                    if with_dlse else None)


def _assert_the_model_is_the_oracle(p, a, dlse):
    keep = dm._keeps(p, a)
    score = dm._plain_score(p, a)
    m = dm.model_backward(p, a, a["dout"], dlse, keep_fwd=keep, keep_bwd=keep, score_fwd=score, score_bwd=score)
    ref = _grads(p, a, dlse)
    for n in ("dq", "dk", "dv"):
        assert _close(m[n], ref[n]), n


def test_the_gqa_index_model_with_one_query_head_per_kv_head_is_the_oracle():
    """g = 1: FA4's mapping (row r // g of head h g + r % g) is the identity, so is the model."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=20, seqlen_k=20, nheads=2, nheads_kv=2,
                         head_dim=32, head_dim_v=32, mods=("rel_bias",))
    a = _arr(p)
    m = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    ref = _grads(p, a)
    assert all(_close(m[n], ref[n]) for n in ("dq", "dk", "dv"))


def _violation(quantity, actual, ref, allow, dout, dlse=None, prop="bwd_budget"):
    v = Violation(prop, f"{quantity}: planted", {"quantity": quantity})
    over = np.abs(actual - ref) > allow
    v.over_indices = np.argwhere(over)
    v.judged = {"actual": actual, "allow": allow, "ctx": {"dout": dout, "dlse": dlse}}
    return v


def _mask_causal_problem():
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=48, seqlen_k=48, nheads=2, nheads_kv=2,
                            head_dim=32, head_dim_v=32, mods=("document",), call=CallForm(mask_causal=True))


def test_mask_mod_causal_absorbs_its_model_and_reports_another_mask():
    p = _mask_causal_problem()
    a = _arr(p)
    right = _grads(p, a)
    model = dm.mask_mod_causal(p, a, a["dout"], None)
    assert not _close(model["dq"], right["dq"], rel=1e-2), "the defect must move dQ here"
    allow = np.full(right["dq"].shape, 1e-3)
    # FA4 with the documented defect (the model, to rounding): absorbed, said within the model
    noisy = model["dq"] + np.random.default_rng(0).uniform(-5e-4, 5e-4, model["dq"].shape)
    v = _violation("dq", noisy, right["dq"], allow, a["dout"])
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "mask_mod_causal_bwd" and v.metrics["known_model"] == "within"
    # another backward: the mask pair AND causal (not what FA4's element mask does): reported
    keep = dm._keeps(p, a)
    causal = np.tril(np.ones((48, 48), bool))
    score = dm._plain_score(p, a)
    other = dm.model_backward(p, a, a["dout"], None, keep_fwd=keep, keep_bwd=lambda b, h: keep(b, h) & causal,
                              score_fwd=score, score_bwd=score)
    seen = 0
    for n in ("dq", "dk", "dv"):
        v = _violation(n, other[n], right[n], np.full(right[n].shape, 1e-3), a["dout"])
        if not len(v.over_indices):
            continue
        seen += 1
        assert match_known_issue(p, v, a, target="production") is None, n
        assert v.metrics["outside_known_model"] == "mask_mod_causal_bwd" and "outside known issue" in v.message
        assert len(v.over_indices) == v.metrics[f"outside_model_{n}"] > 0
        # asked again (the campaign asks once more when the violation is raised): the same answer
        assert match_known_issue(p, v, a, target="production") is None
        assert v.message.count("outside known issue") == 1
    assert seen


def test_a_violation_the_model_does_not_judge_keeps_the_configuration_rule():
    p = _mask_causal_problem()
    v = Violation("bwd_stages", "dq_accum: planted", {"quantity": "dq_accum"})
    ki = match_known_issue(p, v, _arr(p), target="production")
    assert ki is not None and ki.name == "mask_mod_causal_bwd"
    assert v.metrics["known_model"] == "not judged by the model"


def test_score_gqa_model_catches_f2_and_absorbs_unknown_memory():
    """alibi under GQA 8/2 (g = 4): FA4's mapped head h g + r % g lies past the 8 slopes for h >= 2,
    so those rows (and every KV head's dK/dV, which sums them) are unknown and absorbed; dQ of heads
    0 and 1 is judged against the model. Round 12's F2 (head h + r % g) moves head 1's dQ."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=32, seqlen_k=32, nheads=8, nheads_kv=2,
                         head_dim=32, head_dim_v=32, mods=("alibi",), causal=True)
    own = dm.score_mod_gqa_indices(p, _arr(p), _arr(p)["dout"], None)
    assert all(np.isfinite(own[n]).all() for n in ("dq", "dk", "dv"))    # fa4verify's aux: every head known
    a = _caller_aux(p, _arr(p))
    right = _grads(p, a)
    model = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    assert np.isnan(model["dq"][:, :, 2:]).all() and np.isfinite(model["dq"][:, :, :2]).all()
    assert np.isnan(model["dk"]).all()
    allow = np.full(right["dq"].shape, 1e-4)
    v = _violation("dq", np.where(np.isnan(model["dq"]), 7.0, model["dq"]), right["dq"], allow, a["dout"])
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices" and v.metrics["known_model"] == "within"
    # F2: score_mod_bwd (and the recomputed S) see head h + r % g (past the slopes: 9.0)
    got = _head_shift(p, a, lambda h, r: h + r % 4)
    v = _violation("dq", got["dq"], right["dq"], allow, a["dout"])
    assert match_known_issue(p, v, a, target="production") is None
    heads = set(v.over_indices[:, 2].tolist())
    assert heads == {1}, heads        # head 0 maps alike under both; heads >= 2 are unknown memory


def test_a_non_finite_gradient_where_the_model_is_finite_is_outside():
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=16, seqlen_k=16, nheads=4, nheads_kv=2,
                         head_dim=32, head_dim_v=32, mods=("rel_bias",))
    a = _arr(p)
    model = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    got = model["dk"].copy()
    got[0, 3, 1, 2] = np.inf
    v = Violation("finite", "dk: 1 non-finite value(s)", {"quantity": "dk"})
    v.over_indices = np.array([[0, 3, 1, 2]])
    v.judged = {"actual": got, "allow": np.inf, "ctx": {"dout": a["dout"], "dlse": None}}
    assert match_known_issue(p, v, a, target="production") is None
    assert v.over_indices.tolist() == [[0, 3, 1, 2]]


def test_where_the_model_does_not_reach_the_configuration_rule_stays_and_says_so():
    """Block sparsity: the misread-accumulator map does not reach it (its tiles are not the plain
    path's); the dQ issue absorbs by its configuration rule and the hit says no model judged it."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=160, seqlen_k=160, nheads=2, nheads_kv=2,
                         head_dim=72, head_dim_v=72, call=CallForm(block_size=(128, 128)))
    a = _arr(p)
    z = np.zeros(a["q"].shape)
    ref = z.copy()
    ref[:, 64:] = 1.0           # FA4's dQ is wrong only past the first 64 rows of a sequence
    v = _violation("dq", z, ref, z, a["dout"])
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding" and v.metrics["known_model"] == "none"


def _varlen(**kw):
    base = dict(arch="sm90", dtype="bf16", batch=3, seqlen_q=21, seqlen_k=19, nheads=4, nheads_kv=2,
                head_dim=32, head_dim_v=32, seqlens_q=(21, 0, 9), seqlens_k=(19, 7, 12))
    base.update(kw)
    return AttentionProblem(**base)


@pytest.mark.parametrize("kw, with_dlse", [(dict(mods=("rel_bias",), causal=True), True),
                                           (dict(mods=("alibi",), sink=True), False),
                                           (dict(sink=True, window_size=(3, 2)), True),
                                           (dict(mods=("seqlen_bias",)), False)])
def test_on_varlen_and_sink_calls_the_model_without_a_defect_is_the_oracle(kw, with_dlse):
    """Per varlen sequence (positions and lengths sequence-local, an empty one included) and with a
    learnable sink in the forward's normaliser, the model's machinery is the right gradient: the
    oracle's (an independent path)."""
    p = _varlen(**kw)
    a = _arr(p)
    _assert_the_model_is_the_oracle(p, a, np.random.default_rng(2).standard_normal((4, 30)) * 0.5
                                    if with_dlse else None)


def _head_shift(p, a, shift):
    """score_mod_bwd (and the recomputed S) handed row r // g of head ``shift(h, r)``: a defect
    other than FA4's (``h * g + r % g``); past the aux tensors: 9.0 (whatever memory)."""
    keep = dm._keeps(p, a)
    return dm.model_backward(p, a, a["dout"], None, keep_fwd=keep, keep_bwd=keep,
                             score_fwd=dm._plain_score(p, a), score_bwd=dm.head_mapped_score(p, a, shift, 9.0))


@pytest.mark.parametrize("sink", [False, True])
def test_on_a_varlen_call_the_score_gqa_model_absorbs_the_defect_and_reports_f2(sink):
    """Red-team round 16 #1: on a varlen call the score-index issue absorbed every gradient
    violation by its configuration (the model stopped at varlen and sinks). Now FA4's mapping on
    each sequence's local rows is absorbed (within the model) and F2 -- head h + r % g -- is
    reported, on the rows and heads where it moves the gradient."""
    p = _varlen(mods=("alibi",), causal=True, sink=sink)
    a = _caller_aux(p, _arr(p))
    right = _grads(p, a)
    model = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    # with a caller's aux of 4 slopes FA4's mapped head h g + r % g lies past it for h >= 2: unknown there
    assert model is not None and np.isnan(model["dq"][:, 2:]).all() and np.isfinite(model["dq"][:, :2]).all()
    assert not _close(model["dq"], right["dq"], rel=1e-2), "the defect must move dQ here"
    allow = np.full(right["dq"].shape, 1e-4)
    noisy = model["dq"] * (1 + np.random.default_rng(0).uniform(-1e-4, 1e-4, model["dq"].shape))
    v = _violation("dq", np.where(np.isnan(noisy), 7.0, noisy), right["dq"], allow, a["dout"])
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices" and v.metrics["known_model"] == "within"
    g = p.nheads // p.nheads_kv
    got = _head_shift(p, a, lambda h, r: h + r % g)
    v = _violation("dq", got["dq"], right["dq"], allow, a["dout"])
    assert match_known_issue(p, v, a, target="production") is None
    assert v.metrics["outside_known_model"] == "sm90_score_mod_gqa_bwd_indices"
    assert set(v.over_indices[:, 1].tolist()) == {1}    # head 0 maps alike; heads >= 2 are unknown memory
    # every sequence with rows judged (the empty second one has none) shows it
    assert {0, 2} <= {0 if t < 21 else 2 for t in v.over_indices[:, 0].tolist()}


def test_mask_mod_causal_model_reaches_varlen_and_sink_calls():
    """The causal mask FA4's backward applies is each sequence's own (bottom-right aligned by its
    lengths); the model absorbs it and reports the mask pair AND causal."""
    p = _varlen(nheads_kv=4, mods=("document",), sink=True, call=CallForm(mask_causal=True))
    a = _arr(p)
    right = _grads(p, a)
    model = dm.mask_mod_causal(p, a, a["dout"], None)
    assert model is not None and not _close(model["dq"], right["dq"], rel=1e-2)
    v = _violation("dq", model["dq"], right["dq"], np.full(right["dq"].shape, 1e-4), a["dout"])
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "mask_mod_causal_bwd" and v.metrics["known_model"] == "within"
    keep = dm._keeps(p, a)
    score = dm._plain_score(p, a)
    bounds = p._seq_bounds()

    def both(b, h):
        _, lq, _, lk = bounds[b]
        return keep(b, h) & (np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq)
    other = dm.model_backward(p, a, a["dout"], None, keep_fwd=keep, keep_bwd=both, score_fwd=score, score_bwd=score)
    v = _violation("dq", other["dq"], right["dq"], np.full(right["dq"].shape, 1e-4), a["dout"])
    assert len(v.over_indices) and match_known_issue(p, v, a, target="production") is None


def _sink_problem():
    # negative scores, a learnable sink: every row overflows (exponent >= 128.5) but row 5 of head 0
    # (126.1: finite), and no row near the edge (found by search)
    from fa4verify.problem import ValueSpec
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=6, seqlen_k=8, nheads=2, nheads_kv=1,
                            head_dim=32, head_dim_v=32, sink=True, causal=True,
                            values=ValueSpec("negative_scores", 7))


class _DkFault:
    """The twin, with dK of key 0 moved by 0.5 (a fault the sink overflow does not explain)."""

    def __init__(self):
        from fa4verify import fuzz
        self.twin = fuzz.TwinTarget()

    def __getattr__(self, n):
        return getattr(self.twin, n)

    def backward(self, problem, a, fwd, **kw):
        g = self.twin.backward(problem, a, fwd, **kw)
        g.dk = np.array(g.dk, copy=True)
        g.dk[0, 0, 0, :] += 0.5
        return g


def _absorbing_run(p, target):
    from fa4verify import fuzz
    hits = []

    def absorb(v):
        ki = match_known_issue(p, v, target="twin")
        if ki is not None:
            hits.append((ki.name, v.prop, v.metrics.get("quantity"), v.metrics.get("known_model")))
        return ki is not None
    tok = fuzz._ABSORB.set(absorb)
    try:
        fuzz.check_problem(p, target, properties=("fwd_budget", "bwd_budget", "finite"))
    finally:
        fuzz._ABSORB.reset(tok)
    return hits


def test_sink_overflow_model_absorbs_the_twin_and_reports_a_dk_fault_in_the_group(monkeypatch):
    """The twin reproduces the sink-fold overflow (LSE = +inf, O = 0 in the rows): within the
    model. A dK fault at a key of the overflowing group: the row rule absorbed every key of the
    (sequence, KV head); the model reports it. A row between the row rule's band (126) and the
    overflow (128) keeps a finite LSE (as measured on an H100): the model says so."""
    from fa4verify import fuzz
    p = _sink_problem()
    a = p.materialize()
    from fa4verify.fuzz.known_issues import sink_gap
    gap, _kc = sink_gap(p, a)
    assert (gap >= 128.5).sum() == 11 and gap[5, 0] < 127.5
    hits = _absorbing_run(p, fuzz.TwinTarget())
    assert hits and {h[0] for h in hits} == {"sink_rowsum_overflow"}
    assert {h[3] for h in hits if h[2] in ("out", "lse", "dq", "dk", "dv")} <= {"within", "not judged by the model"}
    assert any(h[3] == "within" for h in hits)
    with pytest.raises(fuzz.Violation) as ei:
        _absorbing_run(p, _DkFault())
    v = ei.value
    assert v.metrics.get("outside_known_model") == "sink_rowsum_overflow" and v.metrics["quantity"] == "dk"
    assert set(v.over_indices[:, 1].tolist()) == {0}          # key 0 only (row 5 of head 0 sees it)
    # the row rule alone (no model) absorbed the fault: what the model adds
    import dataclasses
    from fa4verify.fuzz import known_issues as K
    monkeypatch.setattr(K, "KNOWN_ISSUES", tuple(dataclasses.replace(k, model=None) for k in K.KNOWN_ISSUES))
    hits = _absorbing_run(p, _DkFault())
    assert ("sink_rowsum_overflow", "bwd_budget", "dk", None) in hits


FTZ_CASE = "tests/regressions/bwd_budget-twin-ftz-floor.json"


def _ftz_case():
    import json
    import pathlib
    case = json.loads((pathlib.Path(__file__).parent.parent / FTZ_CASE).read_text())
    return case, AttentionProblem.from_dict(case["problem"])


def test_the_dq_misread_model_gives_the_value_the_h200_returned():
    """Note [The misread accumulator] against a measurement: on the H200 (2026-11-30) FA4 returned
    dq[1, 72, 0, 3] = -27.75 for this hd-8 causal case where the oracle has 1.4e-27, and 3232 as the
    largest dQ error. The model (the map of FA4's own accumulator: here the twin's, which models
    its arithmetic) gives that element exactly, and the map of the oracle's dQ that largest error."""
    from fa4verify import fuzz
    case, p = _ftz_case()
    assert "-27.75" in case["production_h200"]["summary"] and "3232" in case["production_h200"]["summary"]
    a = p.materialize()
    m = dm.sm90_dq_misread(p, a, a["dout"], None)
    twin = fuzz.TwinTarget()
    g = twin.backward(p, a, twin.forward(p, a))
    dq_twin = np.asarray(g.dq, np.float64)
    got, _ = m["dq"](dq_twin, np.zeros_like(dq_twin))
    assert got[1, 72, 0, 3] == -27.75
    ref = _grads(p, a)["dq"]
    model, _ = m["dq"](ref, np.zeros_like(ref))
    assert round(float(np.max(np.abs(model - ref)))) == 3232
    assert np.array_equal(model[:, :64], ref[:, :64])          # the first 64 rows are their own


def test_the_dq_misread_model_absorbs_the_defect_and_reports_a_fault_past_row_64():
    """The row rule absorbed every dQ element past row 64 at hd 8; the model absorbs only FA4's
    misread and reports a fault there (dQ rows 64.. off by 1 %)."""
    _case, p = _ftz_case()
    p = p.replace(values=p.values.__class__("normal", 3, ()))
    a = p.materialize()
    ref = _grads(p, a)["dq"]
    allow = np.full(ref.shape, 1e-3)
    m = dm.sm90_dq_misread(p, a, a["dout"], None)
    fa4, tol = m["dq"](ref, allow)
    v = _violation("dq", fa4 + 1e-4, ref, allow, a["dout"])
    v.judged["ref"] = ref
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding" and v.metrics["known_model"] == "within"
    faulty = fa4.copy()
    faulty[:, 64:] *= 1.01
    v = _violation("dq", faulty, ref, allow, a["dout"])
    v.judged["ref"] = ref
    assert match_known_issue(p, v, a, target="production") is None
    assert v.metrics["outside_known_model"] == "sm90_dq_accum_hdim_rounding"
    assert (v.over_indices[:, 1] >= 64).all()


def test_a_dq_model_goes_through_the_misread_accumulator():
    """Plan row 114 on an H100 (2026-12-06): alibi under GQA at hd 72 -- FA4's dQ is the misread
    (Note [The misread accumulator]) of the score-index defect's dQ. The score model alone is outside
    it past row 64; composed with the map it absorbs that dQ, and still reports a fault."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=100, seqlen_k=100, nheads=4, nheads_kv=2,
                         head_dim=72, head_dim_v=72, mods=("rel_bias",))
    a = _arr(p)
    right = _grads(p, a)
    score = dm.score_mod_gqa_indices(p, a, a["dout"], None)["dq"]
    allow = np.full(right["dq"].shape, 1e-4)
    fa4, _ = dm.sm90_dq_misread(p, a, None, None)["dq"](score, allow)
    assert not np.allclose(fa4[:, 64:], score[:, 64:])
    v = _violation("dq", fa4, right["dq"], allow, a["dout"])
    v.judged["ref"] = right["dq"]
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices" and v.metrics["known_model"] == "within"
    bad = fa4.copy()
    bad[0, 70, 1, :] += 0.5
    v = _violation("dq", bad, right["dq"], allow, a["dout"])
    v.judged["ref"] = right["dq"]
    assert match_known_issue(p, v, a, target="production") is None
    assert v.over_indices.tolist() == [[0, 70, 1, c] for c in range(72)]


def test_a_misread_of_a_defect_reading_unknown_memory_is_unknown_on_the_padding():
    """Plan row 114 on an H100 at c6d84c7 (alibi, GQA 14/2, hd 72, 67 rows): the score-index
    defect's mapped heads run past the 14 slopes (unknown memory), and the misread accumulator
    returned NaN where it reads the padded rows and columns, which the composed model had as 0:
    the clean control failed. Where the defect's model is unknown anywhere its padding is unknown
    too; a model without unknown rows keeps 0 there (``test_a_dq_model_goes_through_...``)."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=67, seqlen_k=67, nheads=14, nheads_kv=2,
                         head_dim=72, head_dim_v=72, causal=True, window_size=(127, None), mods=("alibi",))
    a = _caller_aux(p, _arr(p))                       # the row's slopes as they were then: 14
    right = _grads(p, a)
    score = dm.score_mod_gqa_indices(p, a, a["dout"], None)["dq"]
    assert np.isnan(score).any()                      # heads past the slopes
    allow = np.full(right["dq"].shape, 1e-4)
    misread = dm.sm90_dq_misread(p, a, None, None)["dq"]
    fa4, _ = misread(score, allow, np.nan)            # NaN where the padding is read, as measured
    zero, _ = misread(score, allow)
    assert (np.isnan(fa4) & ~np.isnan(zero)).any()    # the padding reads exist here
    v = _violation("dq", fa4, right["dq"], allow, a["dout"])
    v.judged["ref"] = right["dq"]
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices" and v.metrics["known_model"] == "within"
    bad = np.where(np.isnan(fa4), fa4, fa4 + 0.0)
    bad[0, 10, 0, :] += 0.5                           # a fault in a row the model knows stays reported
    v = _violation("dq", bad, right["dq"], allow, a["dout"])
    v.judged["ref"] = right["dq"]
    assert match_known_issue(p, v, a, target="production") is None


def _f2_backward(p, a, pair):
    """Round 12's F2 (``score_mod_bwd_gqa_head_unscaled``) as FA4 would compute it: the backward's S
    recomputation keeps FA4's mapping (head ``h g + r % g``); only score_mod_bwd gets ``h + r % g``
    (the mutant edits ``apply_score_mod_bwd_inner`` alone). Heads past the aux tensor read 9.0."""
    from fa4verify import mods
    score = mods.get(pair)
    q_ = p.replace(mods=(pair,))
    aux = mods.aux_for(q_, score, a)
    g = p.nheads // p.nheads_kv
    ki_ = np.arange(p.seqlen_k)[None, :]

    def f2(b, h, rows, x):
        y, fp = np.empty_like(x), np.empty_like(x)
        for r in rows:
            qq = np.array([[int(r) // g]])
            for out, hh, fn in ((y, h * g + int(r) % g, score.ref), (fp, h + int(r) % g, score.grad)):
                try:
                    out[r] = np.broadcast_to(fn(x[r:r + 1].copy(), b, hh, qq, ki_, aux), (1, p.seqlen_k))
                except IndexError:
                    out[r] = 9.0
        return y, fp
    keep = dm._keeps(q_, a)
    return dm.model_backward(q_, a, a["dout"], None, keep_fwd=keep, keep_bwd=keep,
                             score_fwd=dm._plain_score(q_, a), score_bwd=f2)


def test_the_score_head_edge_judges_heads_a_head_mapping_fault_moves():
    """Edge score_head_gqa (head_scale, GQA 8/4): its temperatures cover every head FA4's mapping
    hands the pair (Note [Aux for the mapped heads]), so the model judges every head; round 12's F2 (the
    score_mod_bwd alone handed head h + r % g), missed on an H100 at 985b9b8 and c6d84c7, moves them
    -- with head_scale, whose derivative reads the head; with alibi (dy/dx = 1) it moves nothing."""
    from fa4verify.coverage import cases, space
    p = {n: q for n, q, _b in cases.edge_problems(space.space_for("sm90", "bf16"))}["score_head_gqa"]
    assert p.mods == ("head_scale",)
    p = p.replace(seqlen_q=40, seqlen_k=40)          # the same heads, a CPU-sized oracle
    a = _arr(p)
    model = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    # Note [Aux for the mapped heads]: 16 temperatures, every head FA4's mapping hands the pair
    assert all(np.isfinite(model[n]).all() for n in ("dq", "dk", "dv"))
    right = _grads(p, a)
    got = _f2_backward(p, a, "head_scale")
    # F2's head h + r % 2 and FA4's 2 h + r % 2 have one temperature (2^-(h mod 8)) only at h = 0
    for n, heads in (("dq", {1, 2, 3, 4, 5, 6, 7}), ("dk", {0, 1, 2, 3})):
        v = _violation(n, got[n], right[n], np.full(right[n].shape, 1e-4), a["dout"])
        assert match_known_issue(p, v, a, target="production") is None, n
        assert set(v.over_indices[:, 2].tolist()) == heads, n
    # the same fault under alibi: FA4's own defect, value for value (an equivalent mutant there)
    pa = p.replace(mods=("alibi",))
    ma, ga = dm.score_mod_gqa_indices(pa, a, a["dout"], None), _f2_backward(pa, a, "alibi")
    for n in ("dq", "dk", "dv"):
        fin = np.isfinite(ma[n])
        assert np.allclose(ga[n][fin], ma[n][fin], rtol=1e-12, atol=1e-12), n


def test_the_gqa_dkdv_issue_absorbs_only_its_misread_map():
    """sm90_gqa_dkdv_accum_hdim_rounding absorbs dK / dV only where they are the misread of the
    true sums (red-team round 16 #2: it absorbed every dK / dV violation of its configuration);
    another fault in the same call is reported; a used-length Q keeps the configuration rule."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=100, seqlen_k=150, nheads=4, nheads_kv=2,
                         head_dim=40, head_dim_v=40)
    a = _arr(p)
    right = _grads(p, a)["dk"]
    allow = np.full(right.shape, 1e-4)
    fa4, _ = dm.sm90_dkv_misread(p, a, None, None)["dk"](right, allow)
    assert np.array_equal(fa4[:, :64], right[:, :64]) and not np.allclose(fa4[:, 64:], right[:, 64:])
    v = _violation("dk", fa4, right, allow, a["dout"])
    v.judged["ref"] = right
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_gqa_dkdv_accum_hdim_rounding" and v.metrics["known_model"] == "within"
    bad = fa4.copy()
    bad[0, 3, 1, 5] += 1.0          # a key of the first 64: FA4's map leaves it right
    v = _violation("dk", bad, right, allow, a["dout"])
    v.judged["ref"] = right
    assert match_known_issue(p, v, a, target="production") is None
    assert v.metrics["outside_known_model"] == "sm90_gqa_dkdv_accum_hdim_rounding"
    assert v.over_indices.tolist() == [[0, 3, 1, 5]]
    q = p.replace(seqlens_q=(100,), seqlens_k=(150,), call=CallForm(seqused_q=True, q_capacity=112))
    assert dm.sm90_dkv_misread(q, q.materialize(), None, None) is None
    assert dm.sm90_dkv_misread(q.replace(call=None), a, None, None) is not None


def test_the_score_gqa_model_composes_with_the_dkdv_misread():
    """At an odd head dim under GQA, FA4's dK / dV are the misread of the score-index defect's sums
    (measured on an H100: three plan calls outside the map of the oracle's): absorbed by the
    score-index issue through the map; the map of the oracle's dK alone is outside there."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=100, seqlen_k=150, nheads=4, nheads_kv=2,
                         head_dim=40, head_dim_v=40, mods=("rel_scale",))
    a = _arr(p)
    right = _grads(p, a)["dk"]
    allow = np.full(right.shape, 1e-4)
    sdk = dm.score_mod_gqa_indices(p, a, a["dout"], None)["dk"]
    assert not _close(sdk, right, rel=1e-2), "the score defect must move dK here"
    fa4, _ = dm.sm90_dkv_misread(p, a, None, None)["dk"](sdk, allow)
    v = _violation("dk", fa4, right, allow, a["dout"])
    v.judged["ref"] = right
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices" and v.metrics["known_model"] == "within"
    # the score defect's dK without the misread: not what FA4 returns at hd 40; reported
    v = _violation("dk", sdk, right, allow, a["dout"])
    v.judged["ref"] = right
    assert match_known_issue(p, v, a, target="production") is None


def test_the_varlen_score_gqa_model_is_the_dense_model_of_each_sequence():
    """Each varlen sequence's slice of the model equals the dense model of that sequence alone (its
    rows from 0, the mapping r // g, h g + r % g on them): not a mapping of the packed token index."""
    p = _varlen(nheads=8, nheads_kv=4, mods=("alibi",), causal=True)
    a = _arr(p)
    model = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    for b, (q0, lq, k0, lk) in enumerate(p._seq_bounds()):
        if not lq:
            continue
        d = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=lq, seqlen_k=lk, nheads=8, nheads_kv=4,
                             head_dim=32, head_dim_v=32, mods=("alibi",), causal=True)
        da = dict(_arr(d), q=a["q"][None, q0:q0 + lq], k=a["k"][None, k0:k0 + lk], v=a["v"][None, k0:k0 + lk],
                  dout=a["dout"][None, q0:q0 + lq])
        ref = dm.score_mod_gqa_indices(d, da, da["dout"], None)
        for n, (s0, ln) in (("dq", (q0, lq)), ("dk", (k0, lk)), ("dv", (k0, lk))):
            got = model[n][s0:s0 + ln]
            assert np.array_equal(np.isnan(got), np.isnan(ref[n][0])), (b, n)
            fin = ~np.isnan(got)
            assert fin.any(), "heads 0-3 map inside the 8 slopes"
            assert not fin.any() or _close(got[fin], ref[n][0][fin]), (b, n)


def test_a_row_at_the_overflow_edge_leaves_only_its_lse_unknown():
    """Red-team round 17 #5: a row within half a log2 unit of FA4's overflow edge may go either way;
    the model had its dQ and its KV head's whole dK / dV unknown (absorbed). The two outcomes differ
    by 2^-(gap) of the row's values, so only the LSE is unknown now: FA4's O and gradients either way
    lie within the model, and a dK fault in that KV head is reported."""
    from fa4verify.fuzz.known_issues import sink_gap
    p = _sink_problem()
    a = dict(p.materialize())
    gap, _kc = sink_gap(p, a)
    sink = np.array(a["learnable_sink"], np.float64)
    sink[0] += (128.0 - gap[5, 0]) / np.log2(np.e)        # row 5 of head 0 onto the edge
    a["learnable_sink"] = sink.astype(np.float32)
    gap, _kc = sink_gap(p, a)
    maybe = np.abs(gap - 128.0) < 0.5
    assert maybe[5, 0] and maybe.sum() == 1
    # every other row overflows: the model would be 0 throughout, with no slack -- the edge row and
    # its KV head's dK / dV stay unknown there
    blind = dm.sink_overflow(p, a, a["dout"], None)
    assert np.isnan(blind["out"][0, 5, 0]).all() and np.isnan(blind["dk"]).all()
    sink[1] -= 200.0                                       # head 1's rows: far below the edge, normal
    a["learnable_sink"] = sink.astype(np.float32)
    gap, _kc = sink_gap(p, a)
    assert (np.abs(gap - 128.0) < 0.5).sum() == 1 and not (gap[:, 1] >= 127.5).any()
    model = dm.sink_overflow(p, a, a["dout"], None)
    assert np.isnan(model["lse"][0, 0, 5]) and np.isnan(model["lse"]).sum() == 1
    assert all(np.isfinite(model[n]).all() for n in ("out", "dq", "dk", "dv"))
    right = _grads(p, a)                                   # the oracle: no row overflows
    ob = judge.oracle_forward(p, a)
    assert np.abs(np.asarray(ob.out, np.float64)[0, 5, 0]).max() < 1e-30
    # the rows differ from the oracle by < 1e-37: over an allowance of 0 only, which makes them violations
    allow = np.zeros(right["dq"].shape)
    for edge_row in ("overflowed", "not overflowed"):      # FA4's two outcomes at the edge row: within
        got = model["dq"].copy()
        if edge_row == "not overflowed":
            got[0, 5, 0] = right["dq"][0, 5, 0]
        v = _violation("dq", got, right["dq"], allow, a["dout"])
        assert len(v.over_indices)
        ki = match_known_issue(p, v, a, target="production")
        assert ki is not None and ki.name == "sink_rowsum_overflow" and v.metrics["known_model"] == "within"
    bad = model["dk"].copy()
    bad[0, 2, 0, :] += 0.5                                 # a key of row 5's KV head
    v = _violation("dk", bad, right["dk"], np.full(bad.shape, 1e-6), a["dout"])
    assert match_known_issue(p, v, a, target="production") is None
    assert v.metrics["outside_known_model"] == "sink_rowsum_overflow"


def test_a_row_the_forward_kept_nothing_of_recomputes_p_against_lse_zero():
    """FA4's preprocess hands its backward LSE 0 for a row whose forward LSE is -inf
    (flash_bwd_preprocess.py: ``lse * LOG2_E if lse != -inf else 0.0``); where the backward keeps
    keys of such a row (mask_mod + causal: the document pair empties rows causal keeps), P = exp(S)
    there, not 0. The model against an emulation of that backward written here (review of the
    twenty-sixth session: the model had P = 0, a false alarm of up to 33 on dQ)."""
    for seed in range(40):
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=3, seqlen_q=40, seqlen_k=40, nheads=2, nheads_kv=2,
                             head_dim=32, head_dim_v=32, seqlens_q=(40, 30, 20), seqlens_k=(40, 8, 30),
                             mods=("document",), call=CallForm(mask_causal=True), mod_seed=seed)
        a = p.materialize()
        keep = dm._keeps(p, a)
        causal = [np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq for _q0, lq, _k0, lk in p._seq_bounds()]
        if any((~keep(b, 0).any(1) & c.any(1)).any() for b, c in enumerate(causal)):
            break
    else:
        pytest.fail("no document mask in 40 seeds empties a row causal keeps")
    q, k, v, do = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "dout"))
    dq = np.zeros_like(q)
    for b, (q0, lq, k0, lk) in enumerate(p._seq_bounds()):
        for h in range(p.nheads):
            x = q[q0:q0 + lq, h] @ k[k0:k0 + lk, h].T * p.scale
            kf = keep(b, h)
            with np.errstate(all="ignore"):
                y = np.where(kf, x, -np.inf)
                top = np.max(y, 1, keepdims=True)
                top = np.where(np.isfinite(top), top, 0.0)
                s = np.exp(y - top).sum(1, keepdims=True)
                lse = np.where(s > 0, top + np.log(s), -np.inf)
                o = np.where(kf, np.exp(y - lse), 0.0) @ v[k0:k0 + lk, h]
                pb = np.where(causal[b], np.exp(x - np.where(np.isfinite(lse), lse, 0.0)), 0.0)
            ds = pb * (do[q0:q0 + lq, h] @ v[k0:k0 + lk, h].T - (do[q0:q0 + lq, h] * o).sum(-1)[:, None])
            dq[q0:q0 + lq, h] = p.scale * ds @ k[k0:k0 + lk, h]
    m = dm.mask_mod_causal(p, a, a["dout"], None)
    assert _close(m["dq"], dq)
    right = _grads(p, a)
    v_ = _violation("dq", dq, right["dq"], np.full(dq.shape, 1e-4), a["dout"])
    ki = match_known_issue(p, v_, a, target="production")
    assert ki is not None and ki.name == "mask_mod_causal_bwd" and v_.metrics["known_model"] == "within"


def _misread_by_sequence_scan(lens, head_dim, tile, packed):
    """Note [The misread accumulator]'s read map, each read row tried against every sequence's
    rows in turn (the transcription the vectorised search in ``sm90_accum_misread`` replaced)."""
    from fa4verify.kernels import fa4_params as fp
    pin = fp.SM90_DQ_ACCUM_ROUNDINGS_PINNED
    dw, dr = -(-head_dim // pin["main"][1]) * pin["main"][1], -(-head_dim // pin["accum"][1]) * pin["accum"][1]
    cu = np.concatenate([[0], np.cumsum(lens)])
    base = [int((cu[b] + b * tile) // tile * tile) for b in range(len(lens))] if packed else [0] * len(lens)
    c = np.arange(head_dim)[None, :]
    out = []
    for b, n in enumerate(lens):
        g = base[b] + np.arange(n)[:, None]
        s2, j2 = np.divmod((g // 64) * (dr // 8) + c // 8, dw // 8)
        g2, c2 = np.broadcast_arrays(64 * s2 + g % 64, 8 * j2 + c % 8)
        src = np.full((n, head_dim, 3), -1, np.int64)
        for bb in (range(len(lens)) if packed else (b,)):
            hit = (g2 >= base[bb]) & (g2 < base[bb] + lens[bb]) & (c2 < head_dim)
            src[hit] = np.stack([np.full(int(hit.sum()), bb), g2[hit] - base[bb], c2[hit]], 1)
        out.append(src)
    return out


@pytest.mark.parametrize("packed", [True, False])
def test_the_misread_map_equals_a_scan_of_every_sequence(packed):
    from fa4verify.kernels.fa4_params import sm90_accum_misread
    rng = np.random.default_rng(11)
    for _ in range(30):
        lens = [int(x) for x in rng.choice([0, 1, 7, 63, 64, 65, 130, 200], size=int(rng.integers(1, 9)))]
        hd = int(rng.choice([8, 40, 72, 104, 136]))
        tile = int(rng.choice([64, 128]))
        for got, want in zip(sm90_accum_misread(lens, hd, tile, packed), _misread_by_sequence_scan(lens, hd, tile, packed)):
            np.testing.assert_array_equal(got, want)


def test_a_row_in_the_rules_band_but_below_the_edge_is_judged_as_the_oracles():
    """``sink_rowsum_overflow``'s rule counts rows from 126 log2 units (a superset), its model
    overflows rows from 127.5: a row at 126.7 has no overflow (measured finite on an H100), so a
    fault in its O is outside the model, not absorbed by the rule alone (red-team review: the model
    returned None there and the rule took any error)."""
    import math

    from fa4verify.fuzz import known_issues as K
    from fa4verify.problem import ValueSpec
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=4, seqlen_k=4, nheads=1, nheads_kv=1,
                         head_dim=8, head_dim_v=8, sink=True, values=ValueSpec("normal", 1))
    a = dict(p.materialize())
    gap0, _ = K.sink_gap(p, a)
    row_max = np.asarray(a["learnable_sink"], np.float64)[0] - gap0[:, 0] / math.log2(math.e)
    a["learnable_sink"] = np.array([row_max.min() + 126.7 / math.log2(math.e)], np.float32)
    gap, _ = K.sink_gap(p, a)
    assert 126.0 <= np.nanmax(gap) < 127.5 and K._sink_overflow_rows(p, a).any()
    m = dm.sink_overflow(p, a, None, None)
    ref = np.asarray(judge.oracle_forward(p, a).out, np.float64)
    np.testing.assert_array_equal(m["out"], ref)        # no row at the edge: the oracle
    row = int(np.nanargmax(gap[:, 0]))
    act = ref.copy()
    act[0, row, 0, :] += 0.5
    v = Violation("fwd_budget", "out: over budget", {"quantity": "out"})
    v.judged = {"actual": act, "ref": ref, "allow": np.full(ref.shape, 1e-3), "ctx": {"dout": None, "dlse": None}}
    v.over_indices = np.argwhere(np.abs(act - ref) > 1e-3)
    assert match_known_issue(p, v, a, target="production") is None
    assert "outside known issue sink_rowsum_overflow's model" in v.message


#: the default audit's failing call at seed 3 on an H100 (2026-12-07, docs/results/h100/session33_f6947bb/):
#: FA4's dQ = -inf on 1,000 elements where the score-index model gave up to 9.1e44
SEED3 = ('{"format": "fa4verify-attention-problem/1", "arch": "sm90", "dtype": "bf16", "batch": 2, "seqlen_q": 17, '
         '"seqlen_k": 163, "nheads": 3, "nheads_kv": 1, "head_dim": 200, "head_dim_v": 200, "causal": false, '
         '"window_size": [null, null], "softcap": 0.0, "sink": false, "softmax_scale": null, "seqlens_q": null, '
         '"seqlens_k": null, "mask_mod": null, "values": {"distribution": "outliers", "seed": 1955811884, '
         '"params": {"outlier_std": 100.0, "p": 0.01}}, "mods": ["rel_scale"], "mod_seed": 0}')


def test_where_a_defect_overflows_fp32_its_model_is_unknown():
    """Note [A defect's overflow]: the score-index defect on outlier values makes P' and dS' reach
    fp32's range, where FA4 returns inf / NaN and a float64 model a finite value up to 1e308: the
    model is unknown (NaN) exactly there and finite below 2^126 elsewhere; on values that stay in
    range nothing is unknown."""
    p = AttentionProblem.from_json(SEED3)
    a = p.materialize()
    m = dm.score_mod_gqa_indices(p, a, a["dout"], None)
    dq = m["dq"]
    assert np.isnan(dq[0, 5, 1, 0])                  # FA4 gave -inf there
    known = np.isfinite(dq)
    assert 0.5 < known.mean() < 1.0 and np.max(np.abs(dq[known])) < 2.0 ** 126
    allow = np.full(dq.shape, 1e-2)
    act = np.where(known, dq, -np.inf)               # FA4's overflow: absorbed
    v = Violation("finite", "dq: non-finite value(s) where the oracle is finite", {"quantity": "dq"})
    v.judged = {"actual": act, "ref": np.zeros_like(dq), "allow": allow, "ctx": {"dout": a["dout"], "dlse": None}}
    v.over_indices = np.argwhere(~known)
    ki = match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sm90_score_mod_gqa_bwd_indices"
    # values that stay in range: no element unknown
    q = AttentionProblem.from_json(SEED3.replace('"outliers"', '"normal"').replace(
        '"params": {"outlier_std": 100.0, "p": 0.01}', '"params": {}'))
    aq = q.materialize()
    mq = dm.score_mod_gqa_indices(q, aq, aq["dout"], None)
    assert all(np.isfinite(mq[n]).all() for n in ("dq", "dk", "dv"))
