"""The ``seqused_q`` call form and FA4's ``pack_gqa`` switch (Note [Call forms keep the problem's
meaning]): Q and dO reach FA4 batched with a capacity and ``seqused_q``, K/V batched whole or
through ``seqused_k``; the rows past ``seqused_q`` are dropped from O, LSE and dQ; ``pack_gqa=False``
reaches FA4's forward only. CPU: the twin, and the production target's own call code driven
through a stand-in adapter that computes attention in float64 on the used rows and writes NaN in
every row a caller must not read."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fa4verify import call_layout
from fa4verify.fuzz import check_problem
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.fuzz.violation import Violation
from fa4verify.targets import ProductionTarget, TwinTarget

torch = pytest.importorskip("torch")

JUDGED = ("runs", "finite", "fwd_budget", "bwd_budget", "masked_rows")


def _problem(*, kv_used=False, pack_gqa=None, seqlens_q=(5, 0, 9), sk=11, seed=3) -> AttentionProblem:
    sks = (sk, 4, 7) if kv_used else (sk,) * len(seqlens_q)
    return AttentionProblem(arch="sm90", dtype="bf16", batch=len(seqlens_q), seqlen_q=max(seqlens_q),
                            seqlen_k=max(sks), nheads=4, nheads_kv=2, head_dim=32, head_dim_v=32,
                            seqlens_q=tuple(seqlens_q), seqlens_k=sks, values=ValueSpec("normal", seed),
                            call=CallForm(seqused_q=True, q_capacity=max(seqlens_q) + 3, seqused_k=kv_used,
                                          kv_capacity=max(sks) + 2 if kv_used else 0, pack_gqa=pack_gqa))


def test_call_arrays_hold_the_problem_and_filler_and_the_outputs_come_back_without_it():
    p = _problem()
    a = p.materialize()
    c = call_layout.call_arrays(p, a)
    assert c["q"].shape == (3, 12, 4, 32) and c["k"].shape == (3, 11, 2, 32)
    assert list(c["seqused_q"]) == [5, 0, 9] and c["seqused_k"] is None and c["cu_seqlens_q"] is None
    assert np.isfinite(c["q"]).all() and np.abs(c["q"][0, 5:]).max() > 0       # finite filler past the used rows
    q, do = call_layout.gather_q(p, c)
    assert np.array_equal(q, np.asarray(a["q"], np.float32)) and np.array_equal(do, np.asarray(a["dout"], np.float32))
    # FA4-shaped outputs with NaN wherever no query of the problem lives: nothing of it comes back
    out = np.full((3, 12, 4, 32), np.nan)
    lse = np.full((3, 4, 12), np.nan)
    dq = np.full((3, 12, 4, 32), np.nan)
    for b, n in enumerate(p.seqlens_q):
        out[b, :n] = b + np.arange(n)[:, None, None]
        lse[b, :, :n] = b
        dq[b, :n] = -b
    o, l_ = call_layout.to_problem_fwd(p, out, lse)
    g = call_layout.to_problem_grads(p, dq, np.zeros((3, 11, 2, 32)), np.zeros((3, 11, 2, 32)))
    assert o.shape == (14, 4, 32) and l_.shape == (4, 14) and g[0].shape == (14, 4, 32) and g[1].shape == (33, 2, 32)
    assert np.isfinite(o).all() and np.isfinite(l_).all() and np.isfinite(g[0]).all()
    assert o[5, 0, 0] == 2 and o[13, 0, 0] == 2 + 8 and l_[0, 5] == 2


def test_old_call_form_json_and_digests_are_unchanged_and_new_fields_round_trip():
    old = CallForm(seqused_k=True, kv_capacity=9)
    assert set(old.to_dict()) == {"seqused_k", "q_batched", "kv_capacity", "page_size", "page_seed", "spare_pages",
                                  "hostile_nan", "block_size", "block_seed", "block_keep", "mask_mod_fn"}
    for p in (_problem(), _problem(kv_used=True, pack_gqa=False)):
        assert AttentionProblem.from_json(p.to_json()) == p
    with pytest.raises(ValueError, match="equal seqlens_k"):
        AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=3, seqlen_k=5, nheads=1, nheads_kv=1,
                         head_dim=32, head_dim_v=32, seqlens_q=(3, 1), seqlens_k=(5, 2),
                         call=CallForm(seqused_q=True, q_capacity=3))
    with pytest.raises(ValueError, match="q_capacity=2"):
        _problem().replace(call=CallForm(seqused_q=True, q_capacity=2))


@pytest.mark.parametrize("kv_used", [False, True])
def test_the_twin_runs_the_form_as_the_problem_it_describes(kv_used):
    p = _problem(kv_used=kv_used, pack_gqa=False)
    a = p.materialize()
    t = TwinTarget()
    f, f0 = t.forward(p, a), t.forward(p.replace(call=None), a)
    assert np.array_equal(f.out, f0.out) and np.array_equal(f.lse, f0.lse)     # the layout is exact
    check_problem(p, t, properties=JUDGED)


# ------------------------------------------------------------------ production's own call code

class _StandIn:
    """FA4's call contract on the CPU: batched q with ``seqused_q``, K/V batched whole or with
    ``seqused_k``; exact non-causal attention in float64 on the used rows, NaN everywhere else.
    ``shift``: a planted fault, the query rows read one row late."""

    def __init__(self, shift: int = 0):
        self.calls: list[tuple[str, dict]] = []
        self.shift = shift

    @staticmethod
    def _rows(kw, b, q, k):
        nq = int(kw["seqused_q"][b]) if kw.get("seqused_q") is not None else q.shape[1]
        nk = int(kw["seqused_k"][b]) if kw.get("seqused_k") is not None else k.shape[1]
        return nq, nk

    def _attn(self, q, k, v, kw):
        h, hk = q.shape[1], k.shape[1]
        kk, vv = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
        scale = kw.get("softmax_scale") or 1 / math.sqrt(q.shape[-1])
        return torch.softmax(torch.einsum("qhd,khd->hqk", q, kk) * scale, -1), kk, vv, scale

    def forward(self, q, k, v, return_lse=True, **kw):
        self.calls.append(("fwd", dict(kw, q_shape=tuple(q.shape))))
        out = torch.full(q.shape[:3] + (v.shape[-1],), float("nan"), dtype=torch.float64)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float64)
        for b in range(q.shape[0]):
            nq, nk = self._rows(kw, b, q, k)
            if nq == 0 or nk == 0:
                continue
            qb = q[b, self.shift: nq + self.shift].double()
            p, kk, vv, scale = self._attn(qb, k[b, :nk].double(), v[b, :nk].double(), kw)
            out[b, :nq] = torch.einsum("hqk,khd->qhd", p, vv)
            lse[b, :, :nq] = torch.logsumexp(torch.einsum("qhd,khd->hqk", qb, kk) * scale, -1)
        return SimpleNamespace(out=out.to(q.dtype), lse=lse.float(), config={"op": "fwd"})

    def backward(self, q, k, v, out, dout, lse, deterministic=True, dlse=None, **kw):
        """``dlse``: a gradient through the LSE in the call's layout (batch, h, q capacity), read
        ``dlse_shift`` rows late where a fault is planted."""
        self.calls.append(("bwd", dict(kw, q_shape=tuple(q.shape), dlse=dlse is not None)))
        dq = torch.full(q.shape, float("nan"), dtype=torch.float64)
        dk, dv = torch.zeros(k.shape, dtype=torch.float64), torch.zeros(v.shape, dtype=torch.float64)
        sh = getattr(self, "dlse_shift", 0)
        for b in range(q.shape[0]):
            nq, nk = self._rows(kw, b, q, k)
            if nq == 0 or nk == 0:
                continue
            qb, kb, vb = (x.double().detach().requires_grad_(True)
                          for x in (q[b, :nq], k[b, :nk], v[b, :nk]))
            p, kk, vv, scale = self._attn(qb, kb, vb, kw)
            outs = [torch.einsum("hqk,khd->qhd", p, vv)]
            grads = [dout[b, :nq].double()]
            if dlse is not None:
                outs.append(torch.logsumexp(torch.einsum("qhd,khd->hqk", qb, kk) * scale, -1))
                grads.append(dlse[b, :, sh:nq + sh].double())
            torch.autograd.backward(outs, grads)
            dq[b, :nq], dk[b, :nk], dv[b, :nk] = qb.grad, kb.grad, vb.grad
        return SimpleNamespace(dq=dq.to(q.dtype), dk=dk.to(k.dtype), dv=dv.to(v.dtype), dsink=None,
                               config={"op": "bwd"})


@pytest.mark.parametrize("kv_used", [False, True])
def test_production_passes_seqused_q_and_pack_gqa_to_the_forward_and_judges_the_used_rows(kv_used):
    ad = _StandIn()
    p = _problem(kv_used=kv_used, pack_gqa=False)
    check_problem(p, ProductionTarget(adapter=ad, device="cpu"), properties=JUDGED)
    (f, fk), (b, bk) = ad.calls[0], ad.calls[-1]
    assert (f, b) == ("fwd", "bwd")
    for kw in (fk, bk):
        assert kw["q_shape"] == (3, 12, 4, 32) and kw["seqused_q"].tolist() == [5, 0, 9]
        assert "cu_seqlens_q" not in kw and "cu_seqlens_k" not in kw
        assert ("seqused_k" in kw) == kv_used
    assert fk["pack_gqa"] is False and "pack_gqa" not in bk          # FA4's backward never packs


def test_a_call_that_reads_the_wrong_query_rows_fails_the_forward_budget():
    with pytest.raises(Violation) as ei:
        check_problem(_problem(), ProductionTarget(adapter=_StandIn(shift=1), device="cpu"), properties=JUDGED)
    assert ei.value.prop in ("fwd_budget", "finite")


def test_pack_gqa_alone_keeps_the_problems_own_call():
    ad = _StandIn()
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=6, seqlen_k=6, nheads=4, nheads_kv=2,
                         head_dim=32, head_dim_v=32, values=ValueSpec("normal", 1), call=CallForm(pack_gqa=False))
    check_problem(p, ProductionTarget(adapter=ad, device="cpu"), properties=JUDGED)
    (_, fk), (_, bk) = ad.calls[0], ad.calls[-1]
    assert fk["q_shape"] == (2, 6, 4, 32) and fk["pack_gqa"] is False and "pack_gqa" not in bk
    assert "seqused_q" not in fk and "seqused_k" not in fk
    out = check_problem(p, TwinTarget(), properties=JUDGED + ("bwd_stages", "key_permutation"))
    # the twin's stage taps and the key permutation apply to the plain layout (found in review:
    # the taps were dropped on the way, five bwd_stages values undecided)
    assert "bwd_stages" in out.ran and "key_permutation" in out.ran and not out.undecided, out


# ------------------------------------------------------------------ Q packed at capacity offsets

class _PackedStandIn(_StandIn):
    """The stand-in for Q packed at capacity offsets (``cu_seqlens_q`` with ``seqused_q``), causal
    (bottom-right). ``len_from_cu``: the planted fault of source mutant
    seqused_q_ignored_with_cu_seqlens_q, the causal diagonal aligned to the capacity."""

    def __init__(self, len_from_cu: bool = False):
        super().__init__()
        self.len_from_cu = len_from_cu

    def forward(self, q, k, v, return_lse=True, **kw):
        self.calls.append(("fwd", dict(kw, q_shape=tuple(q.shape))))
        cu = kw["cu_seqlens_q"].tolist()
        cap, b_ = cu[1] - cu[0], len(cu) - 1
        qb = q.reshape(b_, cap, *q.shape[1:])
        out = torch.full(qb.shape[:3] + (v.shape[-1],), float("nan"), dtype=torch.float64)
        lse = torch.full((b_, q.shape[1], cap), float("nan"), dtype=torch.float64)
        for b in range(b_):
            nq, nk = int(kw["seqused_q"][b]), k.shape[1]
            if nq == 0:
                continue
            rows = cap if self.len_from_cu else nq
            h, hk = q.shape[1], k.shape[1 + 1]
            kk, vv = (x[b].double().repeat_interleave(h // hk, dim=1) for x in (k, v))
            s = torch.einsum("qhd,khd->hqk", qb[b, :rows].double(), kk) / math.sqrt(q.shape[-1])
            keep = torch.arange(nk)[None, :] <= torch.arange(rows)[:, None] + nk - rows
            s = s.masked_fill(~keep, float("-inf"))
            out[b, :nq] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv)[:nq]
            lse[b, :, :nq] = torch.logsumexp(s, -1)[:, :nq]
        return SimpleNamespace(out=out.reshape(-1, *out.shape[2:]).to(q.dtype),
                               lse=lse.permute(1, 0, 2).reshape(q.shape[1], -1).float(), config={"op": "fwd"})


def _packed_problem(seed=5) -> AttentionProblem:
    return AttentionProblem(arch="sm90", dtype="bf16", batch=3, seqlen_q=9, seqlen_k=11, nheads=4, nheads_kv=2,
                            head_dim=32, head_dim_v=32, seqlens_q=(5, 0, 9), seqlens_k=(11,) * 3, causal=True,
                            values=ValueSpec("normal", seed),
                            call=CallForm(seqused_q=True, q_capacity=14, q_packed=True))


def test_q_packed_goes_at_capacity_offsets_with_seqused_q_and_comes_back_exactly():
    p = _packed_problem()
    a = p.materialize()
    c = call_layout.call_arrays(p, a)
    assert c["q"].shape == (42, 4, 32) and c["cu_seqlens_q"].tolist() == [0, 14, 28, 42]
    assert c["max_seqlen_q"] == 14 and list(c["seqused_q"]) == [5, 0, 9]
    q, do = call_layout.gather_q(p, c)
    assert np.array_equal(q, np.asarray(a["q"], np.float32)) and np.array_equal(do, np.asarray(a["dout"], np.float32))
    t = TwinTarget()
    f, f0 = t.forward(p, a), t.forward(p.replace(call=None), a)
    assert np.array_equal(f.out, f0.out) and np.array_equal(f.lse, f0.lse)
    assert AttentionProblem.from_json(p.to_json()) == p and "Q packed" in p.describe()
    with pytest.raises(ValueError, match="q_packed"):
        CallForm(q_packed=True)


def test_production_passes_packed_q_with_seqused_q_and_a_length_taken_from_cu_seqlens_fails():
    ad = _PackedStandIn()
    check_problem(_packed_problem(), ProductionTarget(adapter=ad, device="cpu"), properties=("runs", "finite", "fwd_budget"),
                  backward=False)
    kw = ad.calls[0][1]
    assert kw["q_shape"] == (42, 4, 32) and kw["cu_seqlens_q"].tolist() == [0, 14, 28, 42]
    assert kw["seqused_q"].tolist() == [5, 0, 9] and kw["max_seqlen_q"] == 14
    with pytest.raises(Violation) as ei:
        check_problem(_packed_problem(), ProductionTarget(adapter=_PackedStandIn(len_from_cu=True), device="cpu"),
                      properties=("runs", "finite", "fwd_budget"), backward=False)
    assert ei.value.prop in ("fwd_budget", "finite")


class _AutogradStandIn(_StandIn):
    """The stand-in with FA4's public autograd entry: its forward, then its backward with the same
    arguments. ``drop_seqused_k``: the planted fault of source mutant
    autograd_varlen_bwd_seqused_k_dropped (the varlen autograd backward forgets seqused_k)."""

    def __init__(self, drop_seqused_k: bool = False):
        super().__init__()
        self.drop = drop_seqused_k

    def forward_backward_autograd(self, q, k, v, dout, *, dlse=None, deterministic=True, **kw):
        f = self.forward(q, k, v, **kw)
        if dout is None:            # a loss through the LSE alone: FA4 takes dO as zero
            dout = torch.zeros(f.out.shape, dtype=q.dtype)
        bkw = {n: x for n, x in kw.items() if not (self.drop and n == "seqused_k")}
        g = self.backward(q, k, v, f.out, dout, f.lse, deterministic=deterministic, dlse=dlse, **bkw)
        return f.out, f.lse, g.dq, g.dk, g.dv, None


def test_the_public_autograd_path_runs_call_forms_and_sees_a_backward_that_drops_seqused_k():
    """Note [The public autograd path] on a call form: seqused_q and seqused_k reach FA4's public
    varlen function with their batched arrays; its backward dropping seqused_k (keys up to the
    capacity, filler included) fails the autograd pass's backward budget."""
    p = _problem(kv_used=True)
    props = JUDGED + ("bwd_stages",)
    out = check_problem(p, ProductionTarget(adapter=_AutogradStandIn(), device="cpu"), properties=props)
    assert "bwd_stages" in out.ran
    with pytest.raises(Violation) as ei:
        check_problem(p, ProductionTarget(adapter=_AutogradStandIn(drop_seqused_k=True), device="cpu"),
                      properties=props)
    assert ei.value.prop in ("bwd_budget", "finite") and "autograd" in str(ei.value.metrics.get("pass", "")) + \
        str(ei.value)


def test_a_gradient_through_the_lse_reaches_a_call_form_in_its_own_layout():
    """Note [A gradient through the LSE] on a batched layout: the seeded dLSE goes to FA4 in the
    call's (batch, h, q capacity) layout (``call_layout.to_call_lse``), the dLSE pass and the
    autograd-vs-driver bitwise comparison run, and a backward that reads the dLSE one row late fails."""
    p = _problem(kv_used=True)
    props = JUDGED + ("bwd_stages",)
    ad = _AutogradStandIn()
    out = check_problem(p, ProductionTarget(adapter=ad, device="cpu"), properties=props)
    assert "bwd_stages" in out.ran and out.metrics.get("autograd_dlse_bitwise") == 1.0, out.metrics
    assert any(c == "bwd" and kw["dlse"] for c, kw in ad.calls)
    bad = _AutogradStandIn()
    bad.dlse_shift = 1
    with pytest.raises(Violation) as ei:
        check_problem(p, ProductionTarget(adapter=bad, device="cpu"), properties=props)
    assert "dlse" in str(ei.value) or "LSE" in str(ei.value), str(ei.value)


@pytest.mark.parametrize("packed", [False, True])
def test_to_call_lse_inverts_the_calls_lse_layout(packed):
    p = _problem(kv_used=True)
    if packed:
        import dataclasses
        p = p.replace(call=dataclasses.replace(p.call, q_packed=True))
    x = np.random.default_rng(0).standard_normal((p.nheads, sum(p.seqlens_q))).astype(np.float32)
    c = call_layout.to_call_lse(p, x)
    cap = p.call.q_capacity
    assert c.shape == ((p.nheads, p.batch * cap) if packed else (p.batch, p.nheads, cap))
    out = np.zeros((p.batch * cap, p.nheads, 1) if packed else (p.batch, cap, p.nheads, 1))
    _, back = call_layout.to_problem_fwd(p, out, c)
    assert np.array_equal(back, x)
