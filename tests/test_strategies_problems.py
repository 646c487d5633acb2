"""Properties of fa4verify.strategies: problems FA4 accepts, exact values, JSON round trips,
tile-edge bias, shrinking toward small shapes, and the documented value distributions."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings, strategies as st
from hypothesis.errors import InvalidArgument

import fa4verify.strategies as S
from fa4verify.oracles import binary32
from fa4verify.problem import AttentionProblem, MaskMod, ValueSpec, resolve_window, window_keep_mask
from fa4verify.strategies import attention_problems

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True, database=None)


def test_public_module_exports_exactly_all():
    # "@py_builtins"/"@pytest_ar" appear when pytest's assertion rewriting reaches the module
    # (the fa4verify pytest11 entry point marks the package for rewriting): not public names.
    public = {n for n in vars(S) if not n.startswith(("_", "@")) and n not in ("annotations",)}
    assert set(S.__all__) == public, (set(S.__all__) ^ public)
    assert len(S.__all__) == len(set(S.__all__))


@pytest.mark.fa4
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_head_dim_rule_matches_fa4_validate_head_dims(arch):
    from flash_attn.cute import interface
    cc = 9 if arch == "sm90" else 10
    for hd in range(8, 264, 8):
        for hdv in range(8, 264, 8):
            try:
                interface._validate_head_dims.__wrapped__(hd, hdv, cc, 8)
                fa4_ok = True
            except AssertionError:
                fa4_ok = False
            ours = S.head_dim_supported(arch, hd, hdv)
            if ours:  # everything we generate, FA4 accepts
                assert fa4_ok, (arch, hd, hdv)
            elif fa4_ok:  # FA4 accepts more only for the MLA shapes we exclude on purpose
                assert arch == "sm100" and hdv == 512, (arch, hd, hdv)
    for hd, hdv in S.supported_head_dims(arch):
        assert S.head_dim_supported(arch, hd, hdv)


@FAST
@given(st.data(), st.sampled_from(["sm90", "sm100"]))
def test_problems_are_valid_for_their_arch(data, arch):
    p = data.draw(attention_problems(arch=arch, max_seqlen=200, max_head_dim=256))
    assert S.head_dim_supported(arch, p.head_dim, p.head_dim_v)
    if arch == "sm90":
        assert 8 <= p.head_dim <= 256 and p.head_dim % 8 == 0
    else:
        assert p.head_dim <= 128 or (p.head_dim, p.head_dim_v) in ((192, 128), (256, 256))
        if (p.head_dim, p.head_dim_v) == (256, 256):
            assert not (p.softcap or p.sink or p.local or p.mask_mod)
    assert 1 <= p.seqlen_q <= 200 or (p.varlen and p.seqlen_q >= 1)
    assert p.nheads % p.nheads_kv == 0
    if p.mask_mod is not None:
        assert not (p.causal or p.varlen or p.window_size != (None, None))


@FAST
@given(attention_problems(max_seqlen=160, max_head_dim=64))
def test_values_are_exact_in_dtype_and_finite(p):
    a = p.materialize()
    for name in ("q", "k", "v", "dout"):
        x = a[name]
        assert x.dtype == np.float32 and x.shape == p.shapes()["out" if name == "dout" else name]
        assert np.isfinite(x).all()
        rounded = binary32.to_bf16(x) if p.dtype == "bf16" else binary32.to_fp16(x)
        assert np.array_equal(rounded.reshape(x.shape), x), name
    if p.sink:
        s = a["learnable_sink"]
        assert s.shape == (p.nheads,) and np.array_equal(binary32.to_bf16(s), s)
    else:
        assert a["learnable_sink"] is None


@FAST
@given(attention_problems(max_seqlen=160, max_head_dim=64))
def test_json_round_trip_and_deterministic_materialize(p):
    q = AttentionProblem.from_json(p.to_json())
    assert q == p and hash(q) == hash(p) and q.digest() == p.digest()
    json.loads(p.to_json())  # plain JSON
    a, b = p.materialize(), q.materialize()
    for k in a:
        if a[k] is None:
            assert b[k] is None
        else:
            assert np.array_equal(a[k], b[k]), k


def test_seqlen_edges_cover_tile_boundaries():
    e = set(S.seqlen_edges(300))
    for x in (1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 79, 80, 81, 143, 144, 145, 31, 33):
        assert x in e, x
    assert 0 not in e and max(e) <= 300
    assert find(S.seqlens(max_seqlen=10, min_seqlen=0), lambda x: x == 0, settings=settings(database=None)) == 0


def test_shrinks_to_the_simplest_problem_with_a_feature():
    p = find(attention_problems(arch="sm90", max_seqlen=300), lambda p: p.causal,
             settings=settings(database=None, max_examples=500, derandomize=True))
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_kv, p.head_dim) == (1, 1, 1, 1, 1, 8)
    assert p.window_size == (None, None)
    assert not (p.softcap or p.sink or p.mask_mod or p.softmax_scale)
    # the shrinker may stop at a one-sequence varlen batch, which is the same problem
    assert not p.varlen or (p.seqlens_q, p.seqlens_k) == ((1,), (1,))
    assert p.values == ValueSpec("normal", 0, (("sigma", 1.0),)) and p.dtype == "bf16"


def test_shrinks_to_the_first_tile_edge_past_a_tile():
    p = find(attention_problems(arch="sm100", max_seqlen=300, features=()),
             lambda p: p.seqlen_k > 128, settings=settings(database=None, max_examples=2000))
    assert p.seqlen_k == 129


def test_varlen_zero_length_sequences_are_generated():
    p = find(attention_problems(max_seqlen=100, features=("varlen",)),
             lambda p: p.varlen and 0 in p.seqlens_k and 0 in p.seqlens_q,
             settings=settings(database=None, max_examples=2000))
    a = p.materialize()
    assert a["cu_seqlens_q"][-1] == a["q"].shape[0] and a["cu_seqlens_k"][-1] == a["k"].shape[0]
    assert np.all(np.diff(a["cu_seqlens_k"]) >= 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"arch": "sm80"}, "arch='sm80'"),
    ({"dtype": "fp8"}, "dtype='fp8'"),
    ({"max_seqlen": 0}, "max_seqlen=0"),
    ({"max_head_dim": 4}, "max_head_dim=4"),
    ({"features": ("causal", "alibi")}, "alibi"),
    ({"distributions": ("normal", "cauchy")}, "cauchy"),
])
def test_invalid_arguments_are_rejected_with_their_values(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        find(attention_problems(**kwargs), lambda p: True, settings=settings(database=None))


def test_unsupported_head_dim_is_rejected_by_problem():
    # the problem type is plain data (fa4verify.problem, no Hypothesis): a bad field is a ValueError
    with pytest.raises(ValueError, match=r"\(160, 160\).*sm100"):
        AttentionProblem("sm100", "bf16", 1, 4, 4, 1, 1, 160, 160)
    AttentionProblem("sm90", "bf16", 1, 4, 4, 1, 1, 160, 160)


def test_window_semantics_match_fa4_bottom_right_alignment():
    # causal, seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing
    m = window_keep_mask(5, 3, causal=True, window_size=(None, None))
    assert m.tolist() == [[False] * 3, [False] * 3, [True, False, False], [True, True, False], [True, True, True]]
    # (None, 0) is causal; both sides negative drops the window; causal forces right = 0
    assert np.array_equal(window_keep_mask(4, 6, causal=False, window_size=(None, 0)),
                          window_keep_mask(4, 6, causal=True, window_size=(None, None)))
    assert window_keep_mask(4, 6, causal=False, window_size=(-1, -2)).all()
    assert resolve_window(True, (3, 7)) == (False, True, 3, 0)
    # (left, right) = (1, 0): each row sees its aligned key and the one before it
    m = window_keep_mask(3, 3, causal=False, window_size=(1, 0))
    assert m.sum(axis=1).tolist() == [1, 2, 2]
    # a negative side can empty the window: fully masked rows
    assert not window_keep_mask(3, 3, causal=False, window_size=(-1, 0)).any()


def test_fully_masked_rows_in_lse_layout():
    p = AttentionProblem("sm90", "bf16", 2, 5, 3, 2, 1, 16, 16, causal=True)
    r = p.fully_masked_rows()
    assert r.shape == (2, 2, 5) and r[:, :, :2].all() and not r[:, :, 2:].any()
    pv = AttentionProblem("sm90", "bf16", 2, 3, 2, 1, 1, 16, 16, seqlens_q=(3, 1), seqlens_k=(0, 2))
    assert pv.fully_masked_rows().tolist() == [[True, True, True, False]]


def test_mask_mod_patterns():
    doc = MaskMod("document", 1, 0).keep_mask(7, 9)
    assert doc.all()
    sw = MaskMod("sliding_window", 1, 0).keep_mask(4, 4)
    assert sw.sum() == 4 + 3 + 3
    bs = MaskMod("block_sparse", 2, 3, keep_prob=0.5).keep_mask(5, 6)
    assert bs.shape == (5, 6) and np.array_equal(bs[0], bs[1]) and np.array_equal(bs[:, 0], bs[:, 1])
    rows = MaskMod("masked_rows", 1, 5, keep_prob=0.5).keep_mask(50, 3)
    assert 0 < rows.any(axis=1).sum() < 50 and np.array_equal(rows.all(axis=1), rows.any(axis=1))


def _scores(p, a):
    q = a["q"].astype(np.float64)
    k = np.repeat(a["k"].astype(np.float64), p.nheads // p.nheads_kv, axis=-2)
    return np.einsum("bqhd,bkhd->bhqk", q, k) * p.scale


def test_negative_scores_distribution_shifts_every_score():
    p = AttentionProblem("sm90", "bf16", 1, 40, 50, 2, 2, 64, 64,
                         values=ValueSpec("negative_scores", 7, (("shift", 200.0),)))
    s = _scores(p, p.materialize())
    assert s.max() < 0 and abs(np.median(s) + 200) < 20
    # LSE far below ln(FLT_MIN) = -87.3
    assert (np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)).max() < -88.7


@pytest.mark.parametrize("delta", [7.9, 8.0, 8.1])
def test_peaked_rescale_row_max_grows_by_delta_per_tile(delta):
    p = AttentionProblem("sm100", "bf16", 1, 8, 3 * 128, 1, 1, 64, 64,
                         values=ValueSpec("peaked_rescale", 3, (("delta", delta), ("tile_n", 128.0),
                                                                ("sigma", 0.0))))
    s = _scores(p, p.materialize())[0, 0] * math.log2(math.e)   # log2 units
    tile_max = s.reshape(8, 3, 128).max(-1)
    growth = -np.diff(tile_max, axis=1)     # FA4 walks the KV tiles from the last one down
    # inputs rounded to bf16: growth equals delta to within bf16 rounding of q and k
    assert np.allclose(growth, delta, rtol=2 ** -6), growth


def test_outliers_distribution_has_heavy_tail():
    p = AttentionProblem("sm90", "fp16", 1, 256, 256, 4, 4, 128, 128,
                         values=ValueSpec("outliers", 1, (("p", 0.01), ("outlier_std", 100.0))))
    q = p.materialize()["q"]
    frac = np.mean(np.abs(q) > 10)
    assert 0.003 < frac < 0.02 and np.abs(q).max() > 100


def test_seqlens_in_a_range_without_tile_edges_still_draws():
    """Regression (H200 campaign, 2026-11-30): ``seqlens`` over a range holding no tile edge
    (e.g. [201, 210]) raised "Cannot sample from a length-zero sequence"."""
    from hypothesis import given, settings
    from fa4verify._strategies.shapes import seqlens, seqlen_edges

    assert seqlen_edges(210, min_seqlen=201) == ()

    @settings(max_examples=20, database=None, deadline=None)
    @given(seqlens(max_seqlen=210, min_seqlen=201))
    def inner(n):
        assert 201 <= n <= 210

    inner()
