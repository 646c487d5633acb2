"""Production column of the mutant suite (``fa4verify mutants --target production``): on a GPU,
FA4 itself must pass every fa4verify verifier (zero false alarms), and the faults a caller can
express through FA4's API (``PRODUCTION_KNOBS``) are reported. Figures: "measured on <GPU>"."""
from __future__ import annotations

import pytest

from fa4verify import mutants as M
from fa4verify.mutants import suite
from fa4verify import errors


def _gpu_or_skip():
    """CUDA and FA4 are there (the ``gpu`` marker, tests/conftest.py); skip on a GPU whose arch FA4
    runs no SM90/SM100 kernel on."""
    try:
        M.production_arch()
    except errors.DependencyMissing as exc:
        pytest.skip(str(exc))


def test_knob_mutants_apply_only_where_they_change_the_call():
    ps = {p.name: p for p in M.battery("quick")}
    top = M.get_mutant("causal_top_left")
    assert M.production_applies(top, ps["causal_sq_lt_sk"])
    assert not M.production_applies(top, ps["tile_edge"])
    tail = M.get_mutant("tail_tile_dropped")
    assert M.production_applies(tail, ps["tile_edge"])
    assert not M.production_applies(tail, ps["causal_sq_lt_sk"])
    assert not M.production_applies(M.get_mutant("p_cast_rz"), ps["tile_edge"])


@pytest.mark.gpu
def test_production_fa4_raises_no_false_alarm_and_knob_mutants_are_reported(tmp_path):
    _gpu_or_skip()
    res = M.run_suite("quick", target="production")
    assert res.where.startswith("measured on ")
    fa = res.false_alarms()
    fa4 = {v: [(r.problem, r.detail) for r in rows] for v, rows in fa.items()
           if rows and suite._spec(v).group == "fa4verify"}
    assert not fa4, fa4
    assert set(res.mutants) == set(M.PRODUCTION_KNOBS)
    M.write_json(res, str(tmp_path / "mutants_production.json"))
    for m in res.mutants:
        cell, _ = res.fa4verify_cell(m)
        assert cell.status in ("caught", "missed"), (m, cell)
    for m in ("causal_top_left", "causal_off_by_one", "tail_tile_dropped"):
        assert res.fa4verify_cell(m)[0].status == "caught", (m, res.fa4verify_cell(m))


class _FakeAdapter:
    """Stands in for ``fa4verify.kernels.adapter`` on the CPU: runs the SM90 twin with torch
    tensors, so the production target's plumbing (knob translation, buffers, verdicts) is tested
    without a GPU. Figures from it are "CPU twin"."""

    def __init__(self):
        from fa4verify.kernels.twin import attention as ta
        self.ta = ta
        self.calls = []

    @staticmethod
    def _np(t):
        return t.detach().float().cpu().numpy()

    def forward(self, q, k, v, *, softmax_scale=None, causal=False, window_size=(None, None),
                return_lse=True, **_):
        import collections
        import torch
        self.calls.append(("forward", causal, tuple(window_size), int(k.shape[1])))
        r = self.ta.forward(self._np(q), self._np(k), self._np(v), arch="sm90", dtype="bf16",
                            softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        F = collections.namedtuple("F", "out lse config")
        return F(torch.from_numpy(r.out).to(torch.bfloat16), torch.from_numpy(r.lse), None)

    def backward(self, q, k, v, out, dout, lse, *, softmax_scale=None, causal=False,
                 window_size=(None, None), deterministic=False, **_):
        import collections
        import torch
        self.calls.append(("backward", deterministic))
        g = self.ta.backward(self._np(q), self._np(k), self._np(v), self._np(out), self._np(dout),
                             lse=self._np(lse), arch="sm90", dtype="bf16",
                             softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                             deterministic=deterministic)
        B = collections.namedtuple("B", "dq dk dv dsink config")
        t = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
        return B(t(g.dq), t(g.dk), t(g.dv), None, None)


def test_production_plumbing_with_a_fake_adapter(monkeypatch):
    """The knob translations reach the adapter as documented and the knob faults are caught by
    fa4verify on the (twin-backed) fake; the correct calls raise no fa4verify false alarm."""
    import sys
    tw = M.twin_module()
    assert not (tw is None or getattr(tw, "backward", None) is None), "fa4verify.kernels.twin.attention (forward and backward) failed to load (fa4verify's own module)"
    fake = _FakeAdapter()
    import fa4verify.kernels
    monkeypatch.setitem(sys.modules, "fa4verify.kernels.adapter", fake)
    monkeypatch.setattr(fa4verify.kernels, "adapter", fake, raising=False)   # plain imports read the attribute
    monkeypatch.setattr(M.production, "PRODUCTION_DEVICE", "cpu")
    monkeypatch.setattr(M.production, "production_arch", lambda: "sm90")
    ps = {p.name: p for p in M.battery("quick")}
    res = M.run_suite("quick", target="production",
                      problems=(ps["causal_sq_lt_sk"], ps["tile_edge"]),
                      verifier_names=["fwd_budget", "bwd_budget", "determinism"])
    assert set(res.mutants) == set(M.PRODUCTION_KNOBS)
    assert not any(res.false_alarms().values()), res.false_alarms()
    p = ps["causal_sq_lt_sk"]
    fwd_calls = {c[1:] for c in fake.calls if c[0] == "forward"}
    assert (True, (None, None), p.seqlen_k) in fwd_calls                          # as asked
    assert (False, (None, p.seqlen_q - p.seqlen_k), p.seqlen_k) in fwd_calls      # top-left
    assert (False, (None, 1), p.seqlen_k) in fwd_calls                            # off by one
    assert (False, (None, None), 128) in fwd_calls                                # tail dropped
    assert ("backward", False) in fake.calls and ("backward", True) in fake.calls
    for m in ("causal_top_left", "causal_off_by_one", "tail_tile_dropped"):
        assert res.fa4verify_cell(m)[0].status == "caught", (m, res.fa4verify_cell(m))
