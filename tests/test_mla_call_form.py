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
def test_mla_constants_read_from_fa4_source():
    pytest.importorskip("flash_attn.cute", reason="FA4 (flash-attn-4) not installed")
    assert facts.mla_fwd_constants() == {"tile_n": 64, "rescale_threshold": 8.0, "max_offset": 0.0}
    k = facts.kernel_constants("sm100", "bf16", 576, 512, mla=True)
    assert (k.tile_n, k.max_offset, k.rescale_threshold, k.kernel) == (64, 0.0, 8.0, "sm100_mla")
    with pytest.raises(ValueError, match="16-bit"):
        facts.kernel_constants("sm90", "bf16", 576, 512, mla=True)


# ----------------------------------------------------------------------------- edges
def test_mla_edges_on_the_mla_archs_only():
    names = lambda arch: [n for n, _p, _b in edge_problems(space_for(arch, "bf16")) if n.startswith("mla")]
    assert names("sm90") == []
    assert names("sm100") == names("sm103") == ["mla_causal_tail", "mla_short_keys", "mla_decode_1cta",
                                                 "mla_gather_2cta", "mla_gather_1cta"]
    for n, p, bwd in edge_problems(space_for("sm100", "bf16")):
        if n.startswith("mla"):
            assert not bwd and p.call.mla and p.nheads_kv == 1
            assert (p.seqlen_q > p.seqlen_k) == (n == "mla_short_keys")


@pytest.mark.parametrize("name", ["mla_short_keys", "mla_gather_2cta"])
def test_mla_edges_pass_every_plan_property_on_the_twin(name):
    p = next(p for n, p, _b in edge_problems(space_for("sm100", "bf16")) if n == name)
    r = check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES)
    assert "fwd_budget" in r.ran and not r.undecided
    assert 0.05 < r.metrics["tightness_out"] < 1.0
    assert "MLA" in r.skipped["bwd_budget"]


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

    def keep_mask(self, seqlen_q, seqlen_k, inner=None, seq=None):
        m = super().keep_mask(seqlen_q, seqlen_k, inner, seq)
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
                                     lse=torch.from_numpy(np.ascontiguousarray(lse, np.float32)), config=cfg)
    return types.SimpleNamespace(mla_forward=mla_forward, UnsupportedByRelease=(), AdapterRefusal=()), calls


@pytest.mark.parametrize("gather", [0, 128])
def test_production_target_splits_the_problem_into_fa4s_mla_call(gather):
    from fa4verify.targets import ProductionTarget
    ad, calls = _stand_in()
    p = _mla(call=CallForm(qv_dim=512, gather_topk=gather, gather_seed=4), batch=2, seqlen_q=10, seqlen_k=150,
             causal=True)
    r = check_problem(p, ProductionTarget(adapter=ad, device="cpu"), properties=["runs", "finite", "fwd_budget"])
    assert "fwd_budget" in r.ran and not r.undecided
    (c,) = calls
    assert (c["q"], c["k"], c["v"], c["qv"]) == ((2, 10, 4, 64), (2, 150, 1, 64), (2, 150, 1, 512), (2, 10, 4, 512))
    assert ("gather_kv_indices" in c["kw"]) == bool(gather)


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
