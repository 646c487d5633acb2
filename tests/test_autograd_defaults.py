"""Note [The public autograd path] (fa4verify/targets.py): a loss through O alone is called as a
training step calls FA4 -- ``return_lse`` left at FA4's default (red-team round 15: every
grad-enabled audit call passed ``return_lse=True``, so a release whose default training call keeps
no LSE for its backward passed the audit) -- and a loss that reads the LSE asks for it. Checked on
the adapter against a stand-in for FA4's public function (no GPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fa4verify.kernels import adapter  # noqa: E402


def _fake_fa4(monkeypatch, *, lse_without_flag=True):
    seen = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, learnable_sink=None, deterministic=False,
                        return_lse=False):
        seen.append({"return_lse": return_lse})
        out = q * 1.0 + 0.0 * (k.sum() + v.sum())
        keep = return_lse or q.requires_grad          # FA4: the LSE is kept where a backward needs it
        lse = (q.sum(-1).transpose(1, 2) if keep else None) if lse_without_flag or return_lse else None
        return out, lse

    monkeypatch.setattr(adapter, "_require_cuda", lambda: None)
    monkeypatch.setattr(adapter, "_fa4_fn", lambda name: flash_attn_func)
    return seen


def test_a_loss_through_o_alone_leaves_return_lse_at_fa4s_default(monkeypatch):
    seen = _fake_fa4(monkeypatch)
    q = torch.randn(1, 4, 2, 8)
    r = adapter.forward_backward_autograd(q, q, q, torch.ones(1, 4, 2, 8), causal=True)
    assert seen == [{"return_lse": False}]
    assert r[2] is not None and torch.equal(r[2], torch.ones_like(q))       # dO reached dQ
    # a loss that reads the LSE asks for it
    adapter.forward_backward_autograd(q, q, q, torch.ones(1, 4, 2, 8), dlse=torch.ones(1, 2, 4))
    assert seen[-1] == {"return_lse": True}


def test_a_release_that_returns_no_lse_without_the_flag_still_gives_gradients(monkeypatch):
    seen = _fake_fa4(monkeypatch, lse_without_flag=False)
    q = torch.randn(1, 4, 2, 8)
    out, lse, dq, _dk, _dv, _ds = adapter.forward_backward_autograd(q, q, q, torch.ones(1, 4, 2, 8))
    assert seen == [{"return_lse": False}] and lse is None and dq is not None


def test_a_score_pair_on_a_call_form_reaches_the_public_backward_with_its_score_mod_bwd():
    """Red-team round 15: on a call form the public path's keywords came from the forward's
    (``score_mod_bwd`` dropped), so FA4 asserted and the autograd pass of every score pair on a
    batched layout never ran. FA4's public backward gets the pair's ``score_mod_bwd``."""
    from fa4verify.problem import AttentionProblem, CallForm
    from fa4verify.targets import ProductionTarget

    class Recording:
        calls: list = []

        def forward_backward_autograd(self, q, k, v, dout, **kw):
            self.calls.append(kw)
            z = lambda t: torch.zeros(t.shape, dtype=t.dtype)      # noqa: E731
            return z(q), None, z(q), z(k), z(v), None

        def versions(self):
            return {"stand-in": True}

    p = AttentionProblem(arch="sm90", dtype="bf16", batch=3, seqlens_q=(37, 33, 9), seqlens_k=(70, 70, 0),
                         seqlen_q=37, seqlen_k=70, nheads=2, nheads_kv=2, head_dim=64, head_dim_v=64,
                         mods=("alibi",), call=CallForm(seqused_q=True, q_capacity=40, seqused_k=True, kv_capacity=80))
    ad = Recording()
    ProductionTarget(adapter=ad, device="cpu").backward_autograd(p, p.materialize(), deterministic=True)
    kw = ad.calls[-1]
    assert kw.get("score_mod") is not None and kw.get("score_mod_bwd") is not None
    assert kw.get("seqused_q") is not None and "max_seqlen_q" not in kw
