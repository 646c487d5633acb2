"""Known issue ``sm90_sparse_bwd_left_window_unwritten`` (Note [Unwritten KV tiles under a left
window], fa4verify/fuzz/known_issues.py): FA4's SM90 block-sparse backward leaves dK / dV of a KV
tile unwritten when every Q block listed for it lies past the left window's ``m_block_max``.

The closed form the issue uses is checked against a line-by-line transcription of FA4 4.0.0b36's
loop (``flash_bwd_sm90.py`` / ``block_sparse_utils.py consume_block_sparse_mma_bwd_sm90`` /
``block_info.get_m_block_min_max``) at every backward tile_m that divides the Q block, and against
what an H100 returned on the three calls that found it (docs/results/h100/session30_ef3e925/)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fa4verify.fuzz.known_issues import match_known_issue, sparse_bwd_unwritten_keys
from fa4verify.fuzz.violation import Violation
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.problem.calls import CallForm


def _problem(sq, sk, window, block, *, seed=7, keep=0.35, nheads=2, nheads_kv=2, per_head=False, causal=False,
             arch="sm90", hd=64):
    call = CallForm(block_size=block, block_seed=seed, block_keep=keep, block_per_batch=True,
                    block_per_head=per_head)
    return AttentionProblem(arch=arch, dtype="bf16", batch=2, seqlen_q=sq, seqlen_k=sk, nheads=nheads,
                            nheads_kv=nheads_kv, head_dim=hd, head_dim_v=hd, causal=causal, window_size=window,
                            values=ValueSpec("normal", seed=1), call=call)


def _ceil_div(a: int, b: int, *, trunc: bool) -> int:
    """``cute.ceil_div(a, b) = (a + b - 1) // b`` with C's truncating or Python's flooring division
    (which one the DSL's Int32 takes does not matter here: both give <= 0 for a <= 0)."""
    n = a + b - 1
    return int(n / b) if trunc else n // b


def _fa4_unwritten(problem: AttentionProblem, tile_m: int, *, trunc: bool) -> np.ndarray:
    """FA4's loop, transcribed: per (batch, head, KV tile n) ``process_tile`` from the listed count,
    then the subtiles ``m = idx * f + o`` it runs (``m < m_block_max``); a processed tile that runs
    none is unwritten."""
    call = problem.call
    bq, bk = call.block_size
    f = bq // tile_m
    wl = problem.window_size[0]
    g = problem.nheads // problem.nheads_kv
    out = np.zeros((problem.batch * problem.seqlen_k, problem.nheads_kv), bool)
    sq, sk = problem.seqlen_q, problem.seqlen_k
    for b in range(problem.batch):
        for h in range(problem.nheads):
            listed = call.block_mask(sq, sk, seq=b, head=h)
            for n in range(listed.shape[1]):
                m_block_max = _ceil_div(sq, tile_m, trunc=trunc)
                m_idx_left = (n + 1) * bk + sq - sk + wl
                m_block_max = min(m_block_max, _ceil_div(m_idx_left, tile_m, trunc=trunc))
                idx = np.flatnonzero(listed[:, n])
                total = idx.size * f                       # get_total_q_block_count_bwd
                ran = any(i * f + o < m_block_max for i in idx for o in range(f))
                if total > 0 and not ran:
                    out[b * sk + n * bk:b * sk + min((n + 1) * bk, sk), h // g] = True
    return out


@pytest.mark.parametrize("block", [(128, 128), (128, 96), (128, 64), (64, 128), (128, 48)])
@pytest.mark.parametrize("trunc", [True, False])
def test_the_closed_form_is_fa4s_loop_at_every_tile_m(block, trunc):
    rng = np.random.default_rng(block[0] * 1000 + block[1] + trunc)
    hit = 0
    for case in range(40):
        sq, sk = (int(x) for x in rng.integers(1, 420, 2))
        wl = int(rng.choice([0, 1, 7, 65, 130, 300, int(rng.integers(0, 500))]))
        p = _problem(sq, sk, (wl, None), block, seed=case, nheads=4, nheads_kv=int(rng.choice([1, 2, 4])),
                     per_head=bool(case % 2))
        got = sparse_bwd_unwritten_keys(p)
        hit += int(got.any())
        for tile_m in (t for t in (64, 80, 128) if block[0] % t == 0):
            assert np.array_equal(got, _fa4_unwritten(p, tile_m, trunc=trunc)), (case, tile_m, p.describe())
    assert hit >= 5          # the draws reach the defect, so the comparison says something


@pytest.mark.parametrize("name, sq, sk, hd, window, block, seed, measured", [
    # (batch, key, KV head) of the worst dK elements the H100 returned, and its count of dK elements
    # over budget (docs/results/h100/session30_ef3e925/srcmut/*.json.gz)
    ("variant_bs_d72_fwd_128x128_local", 389, 391, 72, (1, None), (128, 128), 44511,
     ([(0, 72, 0), (0, 72, 1), (0, 73, 0)], 14848)),
    ("judged_variant_bs_d72_fwd_128x128_local", 389, 391, 64, (1, None), (128, 128), 44511,
     ([(0, 24, 0), (0, 25, 0), (0, 26, 0)], 12768)),
    ("variant_bs_d256_bwd_64x64_local_mha_nondet", 261, 199, 256, (65, None), (128, 64), 12912,
     ([(0, 17, 1), (0, 7, 1), (0, 6, 1)], 27828)),
])
def test_the_h100s_wrong_keys_are_the_predicted_ones(name, sq, sk, hd, window, block, seed, measured):
    p = _problem(sq, sk, window, block, seed=seed, keep=0.6, hd=hd)
    bad = sparse_bwd_unwritten_keys(p)
    worst, n_over = measured
    assert all(bad[b * sk + s, h] for b, s, h in worst)
    assert n_over <= int(bad.sum()) * hd          # every over element fits in the predicted keys


def _violation(prop, quantity, idx):
    v = Violation(prop, f"{quantity}: planted", {"quantity": quantity})
    v.over_indices = np.asarray(idx)
    return v


_CASE = dict(sq=389, sk=391, window=(1, None), block=(128, 128), seed=44511, keep=0.6, hd=72)


@pytest.mark.parametrize("change, prop, quantity, where, expect", [
    ({}, "bwd_budget", "dk", "inside", True),
    ({}, "bwd_budget", "dv", "inside", True),
    ({}, "finite", "dk", "inside", True),
    ({}, "deterministic_bwd", "dk", "inside", True),
    ({}, "masked_rows", "dv", "inside", True),         # the H100's warm run at a95cad6: dV != 0 on 64 keys
    ({}, "bwd_budget", "dk", "mixed", False),          # one element at a key FA4 writes
    ({}, "bwd_budget", "dq", "inside", False),         # dQ is right
    ({}, "fwd_budget", "dk", "inside", False),
    ({"arch": "sm100"}, "bwd_budget", "dk", "inside", False),       # SM 10.x clamps the subtile instead
    ({"window": (None, 1)}, "bwd_budget", "dk", "inside", False),   # no left window: m_block_max whole
    ({"window": (None, None), "causal": True}, "bwd_budget", "dk", "inside", False),
])
def test_the_issue_takes_only_the_unwritten_keys(change, prop, quantity, where, expect):
    kw = dict(_CASE)
    kw.update(change)
    p = _problem(kw.pop("sq"), kw.pop("sk"), kw.pop("window"), kw.pop("block"), **kw)
    base = sparse_bwd_unwritten_keys(_problem(**_CASE))
    tok, head = np.nonzero(base)
    inside = [(t // 391, t % 391, h, 3) for t, h in zip(tok[:50], head[:50])]
    written = np.argwhere(~base)[0]
    idx = inside + ([(written[0] // 391, written[0] % 391, written[1], 0)] if where == "mixed" else [])
    v = _violation(prop, quantity, idx)
    ki = match_known_issue(p, v, a={}, target="production")
    assert (ki is not None and ki.name == "sm90_sparse_bwd_left_window_unwritten") == expect, ki
    if expect:      # the hit says its rule named the elements (the coverage summary counts them so)
        assert v.metrics["known_model"] == "elements"


def test_the_twin_target_is_not_taken():
    p = _problem(**_CASE)
    tok, head = np.nonzero(sparse_bwd_unwritten_keys(p))
    v = _violation("bwd_budget", "dk", [(tok[0] // 391, tok[0] % 391, head[0], 0)])
    assert match_known_issue(p, v, a={}, target="twin") is None


def test_a_list_that_reaches_the_window_leaves_every_key_written():
    """Every KV block listed with Q block 0 (which every left window reaches while seqlen_q <=
    seqlen_k): nothing is unwritten, so the issue takes nothing."""
    p = _problem(200, 300, (3, None), (128, 128), keep=1.0)
    assert not sparse_bwd_unwritten_keys(p).any()
    p = dataclasses.replace(p, window_size=(3, 2))
    assert not sparse_bwd_unwritten_keys(p).any()


def test_masked_rows_names_the_keys_and_heads_of_a_gradient_no_query_should_have():
    """The ``masked_rows`` violation of dK / dV carries its quantity and the (batch, key, KV head)
    of every offending key, so a known issue can take exactly those (the H100's warm run at a95cad6
    reported "dv != 0 on 64 key(s) no query can see" with neither, and no issue could)."""
    import importlib
    from fa4verify.fuzz import TwinTarget, check_problem
    importlib.import_module("fa4verify.kernels.twin.attention")

    class Unzeroed(TwinTarget):
        def backward(self, problem, a, fwd, *, deterministic=True):
            g = super().backward(problem, a, fwd, deterministic=deterministic)
            g.dv[0, 1, 1, :] = 3.0          # key 1 of KV head 1: no query sees it under window (1, 0)
            return g

    p = AttentionProblem("sm90", "bf16", 1, 5, 12, 4, 2, 16, 16, window_size=(1, 0))
    check_problem(p, TwinTarget(), properties=["masked_rows"])
    with pytest.raises(Violation) as ei:
        check_problem(p, Unzeroed(), properties=["masked_rows"])
    v = ei.value
    assert v.metrics["quantity"] == "dv" and v.over_indices.tolist() == [[0, 1, 1, 0]]


def _source_copy(tmp_path, edit=None):
    from fa4verify.kernels import fa4_params
    d = fa4_params.fa4_source_dir()
    if d is None:
        pytest.skip("flash-attn-4 is not installed: no source to read")
    src = (d / "block_sparse_utils.py").read_text()
    if edit is not None:
        old, new = edit
        assert old in src
        src = src.replace(old, new)
    (tmp_path / "block_sparse_utils.py").write_text(src)
    return tmp_path


@pytest.mark.parametrize("edit, defect", [
    (None, True),                    # flash-attn-4 4.0.0b36 as installed
    # a release whose count leaves out the subtiles past m_block_max (the tile then takes the zero path)
    (("    return total * q_subtile_factor\n",
      "    return total * q_subtile_factor if m_block_max > 0 else 0\n"), False),
    # a release whose consumer runs every listed subtile
    (("if m_block < m_block_max:", "if True:"), False),
])
def test_the_issue_applies_only_to_a_release_with_the_defects_shape(tmp_path, monkeypatch, edit, defect):
    """Known issues apply to the configuration their evidence describes: the issue reads the
    installed FA4's ``block_sparse_utils.py`` and takes nothing from a release without the shape."""
    from fa4verify.kernels import fa4_params
    d = _source_copy(tmp_path, edit)
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: d)
    fa4_params.sm90_sparse_bwd_unwritten.cache_clear()
    try:
        assert fa4_params.sm90_sparse_bwd_unwritten()["defect"] is defect
        p = _problem(**_CASE)
        assert bool(sparse_bwd_unwritten_keys(p).any()) is defect
    finally:
        fa4_params.sm90_sparse_bwd_unwritten.cache_clear()
