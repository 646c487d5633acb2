"""Note [MLA as a call form]: FA4's MLA forward (``qv``) and its top-k gather judged as standard
attention on the concatenated q', k' -- the call form's rules, its values, the kernel constants
read from FA4, the constructed edges, the production target's split and LSE layout (a stand-in
adapter bound against the real ``adapter.mla_forward``), and faults the judge must see (CPU twin)."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import types

import numpy as np
import pytest

from fa4verify.checks.coverage import PLAN_PROPERTIES
from fa4verify.coverage.cases import edge_problems
from fa4verify.coverage.space import space_for
from fa4verify.fuzz.properties import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.kernels import facts
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.targets import TwinTarget

MLA = dict(arch="sm100", dtype="bf16", nheads_kv=1, head_dim=576, head_dim_v=512)


def _mla(call=CallForm(qv_dim=512), **kw):
    base = dict(MLA, batch=1, seqlen_q=40, seqlen_k=90, nheads=4, values=ValueSpec("normal", 3), call=call)
    base.update(kw)
    return AttentionProblem(**base)


# ----------------------------------------------------------------------------- the call form
@pytest.mark.parametrize("change, msg", [
    (dict(arch="sm90"), "SM 10.x/11.x"),
    (dict(head_dim=128 + 512), "does not take"),
    (dict(call=CallForm(qv_dim=512, gather_topk=128), seqlens_q=(3, 4), seqlens_k=(50, 60), batch=2, seqlen_q=4,
          seqlen_k=60), "dense call"),
    (dict(window_size=(8, 0)), "no local window"),
    (dict(softcap=10.0), "no local window or softcap"),
    (dict(nheads=4, nheads_kv=2), "one KV head"),
    (dict(dtype="fp8"), "16-bit"),
    (dict(call=CallForm(qv_dim=512, gather_topk=100)), "multiple of 128"),
])
def test_mla_call_form_refuses_what_fa4_refuses(change, msg):
    with pytest.raises(ValueError, match=msg):
        _mla(**change)


def test_gather_needs_mla_and_mla_takes_no_other_form():
    with pytest.raises(ValueError, match="needs qv_dim"):
        CallForm(gather_topk=128)
    with pytest.raises(ValueError, match="no other call form"):
        CallForm(qv_dim=512, pack_gqa=True)


def test_mla_head_dims_are_fa4s_only():
    for hd, hdv, qv in ((512 + 512, 512, 512), (64 + 256, 256, 256), (128 + 512, 512, 512)):
        with pytest.raises(ValueError, match="does not take"):
            _mla(head_dim=hd, head_dim_v=hdv, call=CallForm(qv_dim=qv))
    with pytest.raises(ValueError, match="gather_seed"):
        CallForm(qv_dim=512, gather_topk=128, gather_seed=-1)


def test_values_tie_k_tail_to_v_and_default_scale_is_fa4s():
    p = _mla()
    a = p.materialize()
    np.testing.assert_array_equal(a["k"][..., 64:], a["v"])
    assert not np.array_equal(a["k"][..., :64], a["v"][..., :64])
    assert p.scale == 1.0 / math.sqrt(64 + 512)     # interface.py: 1/sqrt(head_dim + head_dim_v) with qv


def test_gather_indices_distinct_with_sentinels_empty_and_full_rows():
    call = CallForm(qv_dim=512, gather_topk=128, gather_seed=11)
    idx = call.gather_indices(20, 300, seq=1)
    assert idx.shape == (20, 128) and idx.dtype == np.int32
    np.testing.assert_array_equal(idx, call.gather_indices(20, 300, seq=1))      # deterministic
    assert not np.array_equal(idx, call.gather_indices(20, 300, seq=0))          # per batch entry
    counts = (idx >= 0).sum(axis=1)
    assert counts.min() == 0 and counts.max() == 128 and 0 < np.median(counts) < 128
    for row in idx:
        keys = row[row >= 0]
        assert len(set(keys.tolist())) == len(keys) and keys.max(initial=0) < 300
    keep = call.keep_mask(20, 300, seq=1)
    np.testing.assert_array_equal(keep.sum(axis=1), counts)


def test_causal_gather_keep_mask_is_slots_and_the_causal_limit():
    p = _mla(call=CallForm(qv_dim=512, gather_topk=128, gather_seed=5), batch=2, seqlen_q=9, seqlen_k=200,
             causal=True)
    for b, keep in enumerate(p.keep_masks()):
        idx = p.call.gather_indices(9, 200, seq=b)
        for i in range(9):
            want = {int(j) for j in idx[i] if 0 <= j < i + 1 + 200 - 9}     # FA4's seqlen_k_limit
            assert set(np.flatnonzero(keep[i]).tolist()) == want


def test_json_round_trip_and_old_json_unchanged():
    p = _mla(call=CallForm(qv_dim=512, gather_topk=256, gather_seed=7), seqlen_k=300)
    assert AttentionProblem.from_json(p.to_json()) == p
    assert "qv_dim" not in CallForm(pack_gqa=True).to_dict()


# ----------------------------------------------------------------------------- kernel constants
_MLA_FILES = ("interface.py", "flash_fwd_mla_sm100.py", "flash_fwd_mla_1cta_sm100.py",
              "flash_fwd_mla_1cta_kb64_sm100.py")


_REAL_FA4: dict = {}


def _fa4_copy(tmp_path, monkeypatch, edit):
    """A copy of the installed FA4's MLA files, ``edit(name, text) -> text`` applied, as the
    source fa4verify reads."""
    from fa4verify.kernels import fa4_params
    src = _REAL_FA4.setdefault("dir", fa4_params.fa4_source_dir())     # the installed one, not a copy
    for name in _MLA_FILES:
        (tmp_path / name).write_text(edit(name, (src / name).read_text()))
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    facts._source_text.cache_clear()
    facts.mla_fwd_constants.cache_clear()
    facts.mla_head_dims.cache_clear()


@pytest.mark.fa4
def test_mla_constants_read_from_fa4_source(tmp_path, monkeypatch):
    assert facts.mla_fwd_constants() == {"tile_n": 64, "rescale_threshold": 8.0, "max_offset": 0.0,
                                         "train_rescale_threshold": 0.0}
    assert facts.mla_head_dims() == (64, 512)
    k = facts.kernel_constants("sm100", "bf16", 576, 512, mla=True)
    assert (k.tile_n, k.max_offset, k.rescale_threshold, k.kernel) == (64, 0.0, 8.0, "sm100_mla")
    with pytest.raises(ValueError, match="16-bit"):
        facts.kernel_constants("sm90", "bf16", 576, 512, mla=True)

    def edit(name, text):      # another release: narrower tiles, another threshold and head dims
        text = text.replace("self.tile_n = 64", "self.tile_n = 32").replace("else 8.0", "else 4.0")
        text = text.replace("mla_fwd_rescale_threshold = 0.0 if", "mla_fwd_rescale_threshold = 8.0 if")
        return text.replace("assert head_dim_v == 512\n", "assert head_dim_v == 256\n")
    try:
        _fa4_copy(tmp_path, monkeypatch, edit)
        assert facts.mla_fwd_constants() == {"tile_n": 32, "rescale_threshold": 4.0, "max_offset": 0.0,
                                             "train_rescale_threshold": 8.0}
        assert facts.mla_head_dims() == (64, 256)
        # a training forward that rescales lazily: its saved P exceeds 1, outside the saved-P budget
        from fa4verify.targets import MLA_BWD_UNJUDGED
        saved = AttentionProblem(**dict(MLA, head_dim=64 + 256, head_dim_v=256), batch=1, seqlen_q=4, seqlen_k=130,
                                 nheads=4, call=CallForm(qv_dim=256, gather_topk=128))
        assert TwinTarget().backward_unsupported(saved) == MLA_BWD_UNJUDGED
        assert TwinTarget().backward_unsupported(saved.replace(
            call=CallForm(qv_dim=256, gather_topk=128, recompute_p=True))) is None
        _fa4_copy(tmp_path, monkeypatch, lambda n, t: t.replace(
            "rescale_threshold=self.rescale_threshold if const_expr(self.dtype_Q.width == 16) else 0.0,",
            "rescale_threshold=self.rescale_threshold if const_expr(self.dtype_Q.width == 16) else 0.0,\n"
            "                max_offset=8,"))
        from fa4verify.kernels.fa4_params import FA4SourceChanged
        with pytest.raises(FA4SourceChanged, match="max_offset"):
            facts.mla_fwd_constants()
        # the training threshold (the saved-P budget's premise) is read or refused, never guessed
        _fa4_copy(tmp_path, monkeypatch, lambda n, t: t.replace(
            "mla_fwd_rescale_threshold = 0.0 if (requires_grad and sparse_kv) else 8.0",
            "mla_fwd_rescale_threshold = 0.0 if requires_grad else 8.0"))
        with pytest.raises(FA4SourceChanged, match="mla_fwd_rescale_threshold"):
            facts.mla_fwd_constants()
    finally:
        facts._source_text.cache_clear()
        facts.mla_fwd_constants.cache_clear()
        facts.mla_head_dims.cache_clear()


# ----------------------------------------------------------------------------- edges
def test_mla_edges_on_the_mla_archs_only():
    names = lambda arch: [n for n, _p, _b in edge_problems(space_for(arch, "bf16")) if n.startswith("mla")]
    assert names("sm90") == []
    assert names("sm100") == names("sm103") == ["mla_causal_tail", "mla_short_keys", "mla_decode_kb64",
                                                 "mla_decode_1cta", "mla_gather_2cta", "mla_gather_wide",
                                                 "mla_gather_1cta"]
    for n, p, bwd in edge_problems(space_for("sm100", "bf16")):
        if n.startswith("mla"):
            assert bwd == bool(p.call.gather_topk) and p.call.recompute_p == (n == "mla_gather_1cta")
            assert p.call.mla and p.nheads_kv == 1
            assert (p.seqlen_q > p.seqlen_k) == (n == "mla_short_keys")
            # the 1-CTA routes: more than one wave of two CTAs per token (gather) or entry (decode)
            tokens = p.batch * p.seqlen_q if p.call.gather_topk else p.batch
            assert (2 * tokens > 148) == ("1cta" in n or "kb64" in n)
    assert names("sm100") and not [n for n, _p, _b in edge_problems(space_for("sm100", "fp16"))
                                   if n.startswith("mla") and _p.dtype != "fp16"]


_EDGES = {n: p for n, p, _b in edge_problems(space_for("sm100", "bf16")) if n.startswith("mla")}


@pytest.mark.parametrize("name", sorted(_EDGES))
def test_mla_edges_forward_within_budget_on_the_twin(name):
    r = check_problem(_EDGES[name], TwinTarget(), properties=PLAN_PROPERTIES, backward=False)
    assert set(r.ran) == {"runs", "masked_rows", "finite", "fwd_budget"} and not r.undecided
    assert 0.05 < r.metrics["tightness_out"] < 1.0


def test_a_gather_budget_counts_every_slot_tile_fa4_walks():
    """top-512 over 130 keys: FA4 walks 512 / 64 slot tiles of the narrowest MLA kernel (most of
    them sentinels), more than the keys span."""
    from fa4verify import judge
    p = _EDGES["mla_gather_wide"]
    assert p.call.gather_topk > p.seqlen_k
    _ro, _rl, st, _ = judge.forward_allowances(p, p.materialize())
    seen = np.concatenate([m.any(axis=1) for m in p.keep_masks()])
    nb = st.row["n_blocks"][:, 0]
    assert (nb[seen] == p.call.gather_topk // facts.mla_fwd_constants()["tile_n"]).all() and (nb[~seen] == 0).all()
    assert (st.row["seqlen_k"] == p.call.gather_topk).all()


def test_the_production_target_refuses_a_varlen_mla_call():
    from fa4verify.targets import ProductionTarget, Unsupported
    ad, _ = _stand_in()
    p = _mla(batch=2, seqlens_q=(3, 4), seqlens_k=(50, 60), seqlen_q=4, seqlen_k=60)
    with pytest.raises(Unsupported, match="varlen MLA"):
        ProductionTarget(adapter=ad, device="cpu").forward(p, p.materialize())


# ----------------------------------------------------------------------------- faults
class _QvDropped(TwinTarget):
    """An MLA kernel that loses the qv . v term (the logits of the rope part only)."""

    def forward(self, problem, a):
        a = dict(a, q=np.concatenate([a["q"][..., :64], np.zeros_like(a["q"][..., 64:])], axis=-1))
        return super().forward(problem, a)


class _RopeScale(TwinTarget):
    """An MLA kernel that scales by 1/sqrt(64) (the rope head dim) instead of 1/sqrt(64 + 512)."""

    def forward(self, problem, a):
        return super().forward(problem.replace(softmax_scale=1 / 8), a)


@pytest.mark.parametrize("target", [_QvDropped(), _RopeScale(), TwinTarget(["causal_off_by_one"])],
                         ids=["qv_dropped", "rope_scale", "causal_off_by_one"])
def test_mla_faults_fail_the_forward_budget(target):
    p = _mla(causal=True)
    with pytest.raises(Violation) as e:
        check_problem(p, target, properties=PLAN_PROPERTIES)
    assert e.value.prop == "fwd_budget"


class _SentinelKey0(CallForm):
    """A gather whose ``-1`` slots are read as key 0 (a missing sentinel check)."""

    def keep_mask(self, seqlen_q, seqlen_k, inner=None, seq=None, head=None):
        m = super().keep_mask(seqlen_q, seqlen_k, inner, seq, head)
        m[:, 0] |= (self.gather_indices(seqlen_q, seqlen_k, 0 if seq is None else seq) < 0).any(axis=1)
        return m


class _SentinelFault(TwinTarget):
    def forward(self, problem, a):
        return super().forward(problem.replace(call=_SentinelKey0(**dataclasses.asdict(problem.call))), a)


def test_a_gather_that_reads_its_sentinels_as_key_0_fails():
    p = _mla(call=CallForm(qv_dim=512, gather_topk=128, gather_seed=2), seqlen_q=12, seqlen_k=300)
    assert check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES).ran
    with pytest.raises(Violation) as e:
        check_problem(p, _SentinelFault(), properties=PLAN_PROPERTIES)
    assert e.value.prop in ("fwd_budget", "masked_rows")


# ----------------------------------------------------------------------------- production target
def _stand_in(lse_layout="bshd"):
    """An adapter-shaped module whose ``mla_forward`` is bound against the real adapter's signature
    and computes the MLA formula with the certified oracle (out rounded to bf16); ``lse_layout``
    "bhs" plants a layout fault (FA4's MLA LSE is (b, s, h))."""
    torch = pytest.importorskip("torch")
    adapter = importlib.import_module("fa4verify.kernels.adapter")
    from fa4verify.oracles import mla as omla
    calls = []

    def mla_forward(q, k, v, qv, **kw):
        inspect.signature(adapter.mla_forward).bind(q, k, v, qv, **kw)
        calls.append({n: tuple(t.shape) for n, t in (("q", q), ("k", k), ("v", v), ("qv", qv))} | {"kw": sorted(kw)})
        f = lambda t: t.float().numpy().astype(np.float64)
        idx = kw.get("gather_kv_indices")
        r = omla.forward(f(q), f(k), f(v), f(qv), softmax_scale=kw.get("softmax_scale"), causal=kw["causal"],
                         gather_kv_indices=None if idx is None else idx.numpy())
        lse = r.lse if lse_layout == "bshd" else np.swapaxes(r.lse, 1, 2)
        cfg = types.SimpleNamespace(to_dict=lambda: {"op": "forward", "arch": 100, "tile_mn": None})
        return types.SimpleNamespace(out=torch.from_numpy(r.out.astype(np.float32)).to(torch.bfloat16),
                                     lse=torch.from_numpy(np.ascontiguousarray(lse, np.float32)), config=cfg,
                                     p=None, row_max=None, o_lo=None)

    def mla_backward(q, k, v, qv, out, dout, lse, idx, **kw):
        inspect.signature(adapter.mla_backward).bind(q, k, v, qv, out, dout, lse, idx, **kw)
        calls.append({"backward": sorted(kw)})
        f = lambda t: t.float().numpy().astype(np.float64)
        g = omla.backward(f(q), f(k), f(v), f(qv), None, f(dout), softmax_scale=kw.get("softmax_scale"),
                          causal=kw["causal"], gather_kv_indices=idx.numpy())
        t = lambda x, dt: torch.from_numpy(np.asarray(x, np.float32)).to(dt)
        cfg = types.SimpleNamespace(to_dict=lambda: {"op": "backward", "arch": 100, "tile_mn": None})
        return types.SimpleNamespace(dq=t(g.dq, torch.bfloat16), dk=t(g.dk, torch.float32), dv=t(g.dv, torch.float32),
                                     dqv=t(g.dqv, torch.bfloat16), dsink=None, config=cfg)
    return types.SimpleNamespace(mla_forward=mla_forward, mla_backward=mla_backward, UnsupportedByRelease=(),
                                 AdapterRefusal=()), calls


@pytest.mark.parametrize("gather", [0, 128])
def test_production_target_splits_the_problem_into_fa4s_mla_call(gather):
    from fa4verify.targets import ProductionTarget
    ad, calls = _stand_in()
    p = _mla(call=CallForm(qv_dim=512, gather_topk=gather, gather_seed=4), batch=2, seqlen_q=10, seqlen_k=150,
             causal=True)
    r = check_problem(p, ProductionTarget(adapter=ad, device="cpu"), properties=["runs", "finite", "fwd_budget",
                                                                                 "bwd_budget"], deterministic=False)
    assert "fwd_budget" in r.ran and not r.undecided
    c = calls[0]
    assert (c["q"], c["k"], c["v"], c["qv"]) == ((2, 10, 4, 64), (2, 150, 1, 64), (2, 150, 1, 512), (2, 10, 4, 512))
    assert ("gather_kv_indices" in c["kw"]) == bool(gather)
    if gather:     # the training forward, then FA4's sparse MLA backward, judged in FA4's MLA layout
        assert "bwd_budget" in r.ran and calls[1]["kw"].count("for_backward") == 1
        assert "fwd" in calls[2]["backward"] and "recompute_p" in calls[2]["backward"]
    else:
        assert "no dense MLA backward" in r.skipped["bwd_budget"] and len(calls) == 1


def test_production_target_with_a_wrong_lse_layout_fails():
    from fa4verify.targets import ProductionTarget
    ad, _ = _stand_in(lse_layout="bhs")
    tgt = ProductionTarget(adapter=ad, device="cpu")
    with pytest.raises(Violation) as e:      # seqlen_q == nheads: the shapes agree, the values do not
        check_problem(_mla(seqlen_q=4, seqlen_k=150, nheads=4), tgt, properties=["runs", "finite", "fwd_budget"])
    assert e.value.prop == "fwd_budget" and "lse" in str(e.value)
    with pytest.raises(Violation) as e:      # otherwise the shape says it
        check_problem(_mla(seqlen_q=10, seqlen_k=150, nheads=4), tgt, properties=["runs", "finite", "fwd_budget"])
    assert e.value.prop == "runs" and "shape" in str(e.value)


# ----------------------------------------------------------------------------- the sparse MLA backward
def _sparse(**kw):
    base = dict(call=CallForm(qv_dim=512, gather_topk=128, gather_seed=8, recompute_p=True), batch=1, seqlen_q=10,
                seqlen_k=200, nheads=8)
    base.update(kw)
    return _mla(**base)


def test_recompute_p_needs_a_gather_and_both_p_modes_run():
    with pytest.raises(ValueError, match="needs gather_topk"):
        CallForm(qv_dim=512, recompute_p=True)
    assert "no dense MLA backward" in TwinTarget().backward_unsupported(_mla())
    assert TwinTarget().backward_unsupported(_sparse()) is None
    assert TwinTarget().backward_unsupported(_sparse(call=CallForm(qv_dim=512, gather_topk=128))) is None


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute_p", "saved_p"])
def test_sparse_mla_backward_within_budget_on_the_twin(recompute):
    """The twin's backward rebuilds P (a stand-in for both modes); the saved-P budget is the wider."""
    p = _sparse(causal=True, call=CallForm(qv_dim=512, gather_topk=128, gather_seed=8, recompute_p=recompute))
    r = check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, deterministic=False)
    assert "bwd_budget" in r.ran and not r.undecided
    for n in ("dq", "dk", "dv"):
        assert 0.001 < r.metrics[f"tightness_{n}"] < 1.0
    return r


def test_the_saved_p_budget_is_wider_than_the_recompute_one():
    from fa4verify import judge
    allow = {}
    for rec in (True, False):
        p = _sparse(call=CallForm(qv_dim=512, gather_topk=128, gather_seed=8, recompute_p=rec))
        a = p.materialize()
        ro, _, st, _ = judge.forward_allowances(p, a)
        allow[rec] = st.backward(judge.oracle_backward(p, a), ro.budget, ro.bound, probabilistic=False)
    for n in ("dq", "dk", "dv"):
        assert (allow[False][n] >= allow[True][n]).all() and (allow[False][n] > allow[True][n]).any()


def test_tie_mla_folds_the_latent_half_of_dk_into_dv():
    from fa4verify import judge
    p = _sparse()
    a = p.materialize()
    ro, _, st, _ = judge.forward_allowances(p, a)
    ob = judge.oracle_backward(p, a)
    allow = st.backward(ob, ro.budget, ro.bound, probabilistic=False)
    tob, tallow = judge.tie_mla(p, ob, allow, st)
    np.testing.assert_array_equal(tob.dv, ob.dv + ob.dk[..., 64:])
    assert not tob.dk[..., 64:].any() and not tallow["dk"][..., 64:].any()
    np.testing.assert_array_equal(tallow["dv"], allow["dv"] + allow["dk"][..., 64:])
    np.testing.assert_array_equal(tob.dq, ob.dq)
    plain = _mla(arch="sm90", dtype="bf16", call=None, head_dim=128, head_dim_v=128, nheads_kv=1)
    assert judge.tie_mla(plain, ob, allow, st)[0] is ob


def test_a_dv_without_the_score_use_fails_the_backward_budget(monkeypatch):
    """FA4's dv must hold both uses of v: a backward that drops dS^T qv (the latent half of dk')."""
    from fa4verify import targets
    from fa4verify.targets import Bwd

    def value_use_only(problem, bwd):
        dk = np.array(bwd.dk, copy=True)
        dk[..., problem.head_dim - problem.call.qv_dim:] = 0.0
        return Bwd(bwd.dq, dk, bwd.dv, bwd.dsink)
    monkeypatch.setattr(targets, "mla_grads", value_use_only)
    with pytest.raises(Violation) as e:
        check_problem(_sparse(), TwinTarget(), properties=PLAN_PROPERTIES, deterministic=False)
    assert e.value.prop == "bwd_budget" and "dv" in str(e.value)


class _QvGradDropped(TwinTarget):
    """A sparse MLA backward that returns dqv = 0."""

    def backward(self, problem, a, fwd, **kw):
        g = super().backward(problem, a, fwd, **kw)
        from fa4verify.targets import Bwd
        dq = np.array(g.dq, copy=True)
        dq[..., 64:] = 0.0
        return Bwd(dq, g.dk, g.dv, g.dsink)


def test_a_dropped_dqv_fails_the_backward_budget():
    with pytest.raises(Violation) as e:
        check_problem(_sparse(), _QvGradDropped(), properties=PLAN_PROPERTIES, deterministic=False)
    assert e.value.prop == "bwd_budget" and "dq" in str(e.value)


# ----------------------------------------------------------------------------- dLSE through the public path
def _with_autograd(problem, drop_dlse):
    """The stand-in adapter plus ``mla_forward_backward_autograd`` (bound against the real one),
    exact: the oracle's gradients of ``problem`` given ``dlse`` -- or, with ``drop_dlse``, without
    it, as FA4 4.0.0b36's ``FlashAttnFunc.backward`` calls its sparse MLA backward (no dlse passed)."""
    torch = pytest.importorskip("torch")
    adapter = importlib.import_module("fa4verify.kernels.adapter")
    from fa4verify import judge
    ad, calls = _stand_in()

    def mla_forward_backward_autograd(q, k, v, qv, dout, **kw):
        inspect.signature(adapter.mla_forward_backward_autograd).bind(q, k, v, qv, dout, **kw)
        dl = kw.get("dlse")
        calls.append({"autograd": sorted(kw), "dlse": dl is not None})
        a = problem.materialize()
        dl_p = None if dl is None or drop_dlse else np.swapaxes(dl.numpy().astype(np.float64), 1, 2)
        ob = judge.oracle_backward(problem, a, dlse=dl_p)
        f32 = lambda x: torch.from_numpy(np.asarray(x, np.float32))
        fw = judge.oracle_forward(problem, a)
        return (f32(fw.out), f32(np.swapaxes(fw.lse, 1, 2)), f32(ob.dq[..., :64]), f32(ob.dk[..., :64]),
                f32(ob.dv + ob.dk[..., 64:]), f32(ob.dq[..., 64:]))
    ad.mla_forward_backward_autograd = mla_forward_backward_autograd
    return ad, calls


@pytest.mark.parametrize("drop", [False, True], ids=["dlse_passed", "dlse_dropped"])
def test_the_public_mla_path_with_a_gradient_through_the_lse(drop):
    """bwd_stages runs FA4's public sparse MLA autograd path with a seeded dLSE and judges its
    gradients against the oracle's with that dLSE: a path that drops dLSE (what FA4 4.0.0b36's
    source does) fails there, and only there."""
    from fa4verify.targets import ProductionTarget
    p = _sparse(batch=2, seqlen_q=6, seqlen_k=140)
    ad, calls = _with_autograd(p, drop)
    props = ["runs", "finite", "fwd_budget", "bwd_budget", "bwd_stages"]
    tgt = ProductionTarget(adapter=ad, device="cpu")
    if not drop:
        r = check_problem(p, tgt, properties=props, deterministic=False)
        assert "bwd_stages" in r.ran and not r.undecided
        assert r.metrics["tightness_autograd_dlse_dq"] < 1.0 and r.metrics["tightness_autograd_dv"] < 1.0
    else:
        with pytest.raises(Violation) as e:
            check_problem(p, tgt, properties=props, deterministic=False)
        assert e.value.prop == "bwd_budget" and e.value.metrics.get("pass") == "autograd_dlse"
        assert "public autograd path's, with a gradient through the LSE" in str(e.value)
        assert check_problem(p, tgt, properties=props[:4], deterministic=False).ran   # the driver passes
    assert [c["dlse"] for c in calls if "autograd" in c] == [False, True]


def test_mla_backward_refusals_taps_determinism_and_fp16():
    """FA4's sparse MLA backward: no stage taps, no deterministic mode (both said, never a refusal of
    the whole problem), bf16 inputs only (FA4 asserts): the fp16 audit's gather edges run no backward."""
    from fa4verify.targets import ProductionTarget
    ad, _ = _with_autograd(_sparse(), False)
    tgt = ProductionTarget(adapter=ad, device="cpu")
    tgt.device = "cuda"            # what an audit on a GPU has: the taps would be asked for
    assert "not tapped" in tgt.taps_unsupported(_sparse())
    tgt.device = "cpu"
    r = check_problem(_sparse(), tgt, properties=["runs", "bwd_budget", "deterministic_bwd"], deterministic=False)
    assert "no deterministic mode" in r.skipped["deterministic_bwd"] and "bwd_budget" in r.ran
    assert "bf16 inputs only" in TwinTarget().backward_unsupported(_sparse(dtype="fp16"))
    fp16 = [(n, b) for n, p_, b in edge_problems(space_for("sm100", "fp16")) if n.startswith("mla")]
    assert fp16 and not any(b for _n, b in fp16)


def test_the_dropped_dlse_is_a_known_issue_of_that_pass_only():
    from fa4verify.fuzz.known_issues import match_known_issue
    from fa4verify.targets import ProductionTarget
    p = _sparse(batch=2, seqlen_q=6, seqlen_k=140)
    ad, _ = _with_autograd(p, True)
    with pytest.raises(Violation) as e:
        check_problem(p, ProductionTarget(adapter=ad, device="cpu"),
                      properties=["runs", "bwd_budget", "bwd_stages"], deterministic=False)
    assert match_known_issue(p, e.value, target="production").name == "sm100_sparse_mla_autograd_dlse_dropped"
    assert match_known_issue(p, e.value, target="twin") is None
    with pytest.raises(Violation) as e2:          # the driver's own dv fault: not that issue
        check_problem(p, _QvGradDropped(), properties=PLAN_PROPERTIES, deterministic=False)
    assert match_known_issue(p, e2.value, target="production") is None
