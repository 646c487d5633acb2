"""Note [Two defects in one violation] (fa4verify/fuzz/known_issues.py): an issue that names the
elements its defect reaches takes them out of a violation, and another issue must explain the rest
on its own terms; never a violation either issue's elements leave anything of."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fa4verify.fuzz import known_issues as K
from fa4verify.fuzz.violation import Violation
from fa4verify.problem import AttentionProblem, ValueSpec

#: the default audit's failing call at seed 2 on an H100 (2026-12-07, docs/results/h100/session32_2b4d54e/):
#: FA4 returned LSE = +inf on all 3,832 rows
SEED2 = ('{"format": "fa4verify-attention-problem/1", "arch": "sm90", "dtype": "bf16", "batch": 3, "seqlen_q": 261, '
         '"seqlen_k": 391, "nheads": 8, "nheads_kv": 2, "head_dim": 192, "head_dim_v": 128, "causal": true, '
         '"window_size": [null, null], "softcap": 0.0, "sink": true, "softmax_scale": 0.005208333333333333, '
         '"seqlens_q": [261, 87, 131], "seqlens_k": [391, 198, 382], "mask_mod": null, "values": {"distribution": '
         '"negative_scores", "seed": 1762662989, "params": {"shift": 100.0}}, "call": {"seqused_k": false, '
         '"q_batched": false, "kv_capacity": 0, "page_size": null, "page_seed": null, "spare_pages": 0, '
         '"hostile_nan": false, "block_size": [128, 96], "block_seed": 1450, "block_keep": 0.6, "mask_mod_fn": null}, '
         '"sink_dtype": "bf16"}')


def _lse_violation(p, rows=None):
    tq = sum(p.seqlens_q)
    v = Violation("finite", "lse: non-finite value(s) where the oracle is finite", {"quantity": "lse"})
    every = np.argwhere(np.ones((p.nheads, tq), bool))               # LSE layout (h, t)
    v.over_indices = every if rows is None else every[np.isin(every[:, 1], rows)]
    return v


@pytest.fixture(scope="module")
def seed2():
    p = AttentionProblem.from_json(SEED2)
    return p, p.materialize()


def test_the_h100s_all_rows_infinite_is_the_sink_overflow_with_the_misread_rows_taken_out(seed2):
    p, a = seed2
    misread = K.varlen_sparse_misread_tokens(p)
    gap, _ = K.sink_gap(p, a)
    no_key = ~np.isfinite(gap[:, 0])
    # the rows that see no key (their LSE is the sink's, not an overflow) are misread rows
    assert no_key.any() and misread[no_key].all() and not misread.all()
    v = _lse_violation(p)
    # neither issue alone takes it
    assert not any(ki.applies(p, a, v) for ki in K.KNOWN_ISSUES
                   if ki.name in ("sink_rowsum_overflow", "sm90_varlen_sparse_kv_stride"))
    ki = K.match_known_issue(p, v, a, target="production")
    assert ki is not None and ki.name == "sink_rowsum_overflow"
    assert v.metrics["known_with"] == "sm90_varlen_sparse_kv_stride"
    assert v.metrics["known_with_elements"] == int(misread.sum()) * p.nheads
    # the misread issue is production FA4's: the twin has no such defect to take out
    assert K.match_known_issue(p, _lse_violation(p), a, target="twin") is None


def test_the_misread_rows_alone_are_that_issues_own_and_nothing_is_taken_without_an_explained_rest(seed2):
    p, a = seed2
    misread = np.flatnonzero(K.varlen_sparse_misread_tokens(p))
    v = _lse_violation(p, rows=misread)
    ki = K.match_known_issue(p, v, a, target="production")
    assert ki.name == "sm90_varlen_sparse_kv_stride" and "known_with" not in v.metrics
    # the same call at normal values: no row overflows, so the rows outside the misread ones are
    # nobody's and the violation stands
    normal = dataclasses.replace(p, values=ValueSpec("normal", p.values.seed))
    an = normal.materialize()
    assert K.match_known_issue(normal, _lse_violation(normal), an, target="production") is None


def _toy_issues(garbage_rows):
    """An issue naming key rows ``garbage_rows`` of an (8, 8) dK, and one whose model is the
    oracle's dK (zeros) but 2 in row 6: a stand-in for an elementwise defect beside a modelled one."""
    def names(problem, a, v):
        return np.isin(np.asarray(v.over_indices)[:, 0], garbage_rows) if v.over_indices is not None else None

    def model(problem, a, dout, dlse):
        dk = np.zeros((8, 8))
        dk[6] = 2.0
        return {"dk": dk}
    e = K.KnownIssue("toy_elements", "t", "r", K._names_all(names), targets=("production",), names=names)
    m = K.KnownIssue("toy_model", "t", "r", lambda p, a, v: v.metrics.get("quantity") == "dk",
                     targets=("production",), model=model)
    return [e, m]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
@pytest.mark.parametrize("extra_row, absorbed", [(None, True), (5, False)])
def test_a_model_judges_the_rest_without_the_elements_taken_out(monkeypatch, extra_row, absorbed, order):
    """The modelled defect in row 6, garbage in rows 0-1 (the elementwise issue's) and, in the
    second case, in row 5 too: the model takes the first violation once rows 0-1 are out (a value
    of theirs within the budget but outside the model included), not the second, whichever issue
    comes first (a model's narrowing to its outside elements is not what the next issue judges)."""
    toys = _toy_issues([0, 1])
    monkeypatch.setattr(K, "KNOWN_ISSUES", tuple(toys[i] for i in order))
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=8, head_dim_v=8, values=ValueSpec("normal", 1))
    act = np.zeros((8, 8))
    act[6] = 2.0
    act[0:2] = 3.0
    act[1, 1] = 1e-9                                 # the elementwise issue's, not offending, outside the model
    if extra_row is not None:
        act[extra_row] = 3.0
    v = Violation("bwd_budget", "dk: over budget", {"quantity": "dk"})
    v.judged = {"actual": act, "allow": np.full((8, 8), 1e-10), "ref": np.zeros((8, 8)), "ctx": {"dout": None}}
    v.over_indices = np.argwhere(np.abs(act) > 1e-6)
    raised = v.over_indices.copy()
    ki = K.match_known_issue(p, v, {}, target="production")
    if absorbed:
        assert ki is not None and ki.name == "toy_model" and v.metrics["known_with"] == "toy_elements"
        assert v.metrics["known_with_elements"] == 15 and v.metrics["known_model"] == "within"
        # the hit keeps the violation as raised: its elements, no note of a model's outside
        np.testing.assert_array_equal(v.over_indices, raised)
        assert "outside" not in v.message and not any(k.startswith("outside_") for k in v.metrics)
    else:
        assert ki is None
        # unexplained: narrowed to what lies outside the model, and said so
        assert "outside known issue toy_model's model" in v.message and len(v.over_indices) < len(raised)


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (2, 1, 0)])
@pytest.mark.parametrize("fault", [0.5, 5.0])
def test_with_three_issues_each_candidate_judges_the_whole_rest(monkeypatch, order, fault):
    """Red-team review (thirty-third session): with an elementwise issue A (rows 0-1), another B
    (row 5) and a modelled issue X (row 6), a genuine fault in row 3 that no issue describes is never
    absorbed, in any order: a candidate whose model fails narrows only the rest it judged (before,
    the next candidate judged X's narrowing, and a fault within X's slack passed as A + B)."""
    def rows(r):
        def names(problem, a, v):
            return None if v.over_indices is None else np.isin(np.asarray(v.over_indices)[:, 0], r)
        return names

    def model(problem, a, dout, dlse):
        dk = np.zeros((8, 8))
        dk[6] = 100.0
        return {"dk": dk}
    issues = (K.KnownIssue("A_rows01", "t", "r", K._names_all(rows([0, 1])), targets=("production",),
                           names=rows([0, 1])),
              K.KnownIssue("B_row5", "t", "r", K._names_all(rows([5])), targets=("production",), names=rows([5])),
              K.KnownIssue("X_model", "t", "r", lambda p, a, v: v.metrics.get("quantity") == "dk",
                           targets=("production",), model=model))
    monkeypatch.setattr(K, "KNOWN_ISSUES", tuple(issues[i] for i in order))
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=8, head_dim_v=8, values=ValueSpec("normal", 1))
    act = np.zeros((8, 8))
    act[0:2] = 3.0
    act[5] = 3.0
    act[6] = 100.0
    act[3] = fault
    v = Violation("bwd_budget", "dk: over budget", {"quantity": "dk"})
    v.judged = {"actual": act, "allow": np.full((8, 8), 1e-3), "ref": np.zeros((8, 8)), "ctx": {"dout": None}}
    v.over_indices = np.argwhere(np.abs(act) > 1e-3)
    assert K.match_known_issue(p, v, {}, target="production") is None
    # without the fault, rows 0-1 and 5 and the model's row 6 are three defects: not two either
    act[3] = 0.0
    v = Violation("bwd_budget", "dk: over budget", {"quantity": "dk"})
    v.judged = {"actual": act, "allow": np.full((8, 8), 1e-3), "ref": np.zeros((8, 8)), "ctx": {"dout": None}}
    v.over_indices = np.argwhere(np.abs(act) > 1e-3)
    assert K.match_known_issue(p, v, {}, target="production") is None


@pytest.mark.parametrize("value, absorbed", [(np.nan, True), (0.3, False)])
@pytest.mark.parametrize("prop", ["fwd_budget", "masked_rows", "paged_kv_bitwise"])
def test_the_paged_empty_sequence_issue_names_only_its_nan(prop, value, absorbed):
    """``sm90_paged_tma_empty_seq_nan`` describes O = NaN in a sequence with no keys: a finite wrong
    O there is another fault, never its (red-team review: it named those tokens whatever the value)."""
    from fa4verify.problem.calls import CallForm
    base = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=4, seqlen_k=128, nheads=1, nheads_kv=1,
                            head_dim=128, head_dim_v=128, seqlens_q=(4, 4), seqlens_k=(0, 128),
                            values=ValueSpec("normal", 1))
    p = dataclasses.replace(base, call=CallForm(seqused_k=True, kv_capacity=256, page_size=K._fwd_tile_n(base),
                                                hostile_nan=True))
    p.call.validate(p)
    a = p.materialize()
    out = np.zeros((8, 1, 128))
    out[:4] = value                                  # sequence 0: no keys
    if prop == "masked_rows":
        v = Violation(prop, "O != 0 on 4 fully masked row(s)", {"quantity": "lse_rows"})
        v.over_indices = np.array([[0, t] for t in range(4)])           # LSE layout (h, t)
        v.finite_values = np.isfinite(out[:4, 0]).all(axis=-1)
    else:
        v = Violation(prop, "out: over budget", {"quantity": "out"})
        v.over_indices = np.argwhere(np.ones((4, 1, 128), bool))
        if prop == "fwd_budget":
            v.judged = {"actual": out, "ref": np.zeros_like(out), "allow": np.full(out.shape, 1e-3),
                        "ctx": {"dout": None, "dlse": None}}
        else:
            v.finite_values = np.isfinite(out[:4].reshape(-1))
    ki = K.match_known_issue(p, v, a, target="production")
    assert (ki is not None and ki.name == "sm90_paged_tma_empty_seq_nan") == absorbed


def test_the_misread_rows_are_those_whose_read_holds_other_blocks(seed2):
    """``sm90_varlen_sparse_kv_stride`` names exactly the rows whose O the float64 model of FA4's
    misread (``scripts/varlen_sparse_stride_model.py``: the lists read at stride ceil(len_k / 128))
    moves from the right O (red-team review: 3 of seed 2's 136 named rows read the same blocks)."""
    import importlib.util
    import pathlib
    spec = importlib.util.spec_from_file_location(
        "stride_model", pathlib.Path(__file__).parent.parent / "scripts/varlen_sparse_stride_model.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    p, a = seed2
    right, misread = m.attend(p, a), m.attend(p, a, stride_tile=K.SEQLEN_INFO_TILE_N)
    moved = ~np.all((right == misread) | (np.isnan(right) & np.isnan(misread)), axis=(1, 2))
    named = K.varlen_sparse_misread_tokens(p)
    assert named.any() and np.array_equal(named, moved)


def test_a_hit_with_another_issues_elements_taken_out_counts_both_issues(monkeypatch):
    """Review item (thirty-third session): the issue whose elements a hit took out is counted under
    its own name too, and each hit names the other."""
    from fa4verify.fuzz.campaign import record_hit
    e, m = _toy_issues([0, 1])
    monkeypatch.setattr(K, "KNOWN_ISSUES", (e, m))
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=8, head_dim_v=8, values=ValueSpec("normal", 1))
    hits: dict = {}
    two = Violation("bwd_budget", "dk: over budget", {"quantity": "dk", "known_with": "toy_elements"})
    one = Violation("bwd_budget", "dk: over budget", {"quantity": "dk"})
    record_hit(hits, m, p, two)
    record_hit(hits, m, p, one)
    assert hits["toy_model"]["count"] == 2 and hits["toy_model"]["with"] == {"toy_elements": 1}
    assert hits["toy_elements"]["count"] == 1 and hits["toy_elements"]["with"] == {"toy_model": 1}
    assert hits["toy_elements"]["quantities"] == {"dk": 1} and hits["toy_elements"]["title"] == e.title
