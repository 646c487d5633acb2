"""Blame and honesty rules (Note [Blame], Note [Judged share], Note [One adapter for every
release]) against a FAKE older FA4 release on the CPU.

The fake (``tests/fixtures/fake_fa4_release.py``) is a file ``<tmp>/flash_attn/cute/interface.py``
(so its frames are FA4's frames) with the interface of 4.0.0b20..b25: ``_flash_attn_bwd`` takes no
``learnable_sink``. Variants: the backward renamed (``_flash_attn_backward``: the adapter cannot
drive the release), and a release that refuses every head dim but 64 with its own assertion. The adapter's view of FA4
(``adapter.fa4_interface``) is pointed at the fake; everything above it -- the adapter, the
target, the judge, the campaign merge, the checks' verdicts -- is the product's own code.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

from fa4verify import blame  # noqa: E402
from fa4verify.problem import AttentionProblem  # noqa: E402
from fa4verify.problem import ValueSpec  # noqa: E402
from fa4verify.kernels import adapter  # noqa: E402
from fa4verify.targets import ProductionTarget  # noqa: E402
from fa4verify.errors import HarnessError, Unsupported  # noqa: E402

def _fixture():
    path = os.path.join(os.path.dirname(__file__), "fixtures", "fake_fa4_release.py")
    spec = importlib.util.spec_from_file_location("fake_fa4_release_fixture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load_fake(tmp_path, **kw):
    return _fixture().load(tmp_path, **kw)


@pytest.fixture()
def release(tmp_path, monkeypatch):
    """Install a fake FA4 release as the adapter's view of FA4; returns the installer."""
    def install(**kw):
        mod = _load_fake(tmp_path, **kw)
        monkeypatch.setattr(adapter, "fa4_interface", lambda: mod)
        monkeypatch.setattr(adapter, "_require_cuda", lambda: None)
        monkeypatch.setattr(adapter, "_dist_version",
                            lambda name: "4.0.0b25" if name == "flash-attn-4" else None)
        return mod
    return install


def _problem(hd=64, *, sink=False, causal=False, seed=0) -> AttentionProblem:
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=64, seqlen_k=64, nheads=2, nheads_kv=2,
                            head_dim=hd, head_dim_v=hd, causal=causal, sink=sink,
                            values=ValueSpec("normal", seed))


def _tensors(hd=64):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 64, 2, hd, generator=g).to(torch.bfloat16) for _ in range(4))
    return q, k, v, do


# --------------------------------------------------------------------- the adapter reads signatures
def test_a_keyword_the_release_lacks_is_not_passed_when_the_call_asks_for_nothing(release):
    release()
    q, k, v, do = _tensors()
    f = adapter.forward(q, k, v, return_lse=True)
    b = adapter.backward(q, k, v, f.out, do, f.lse, deterministic=True)   # no TypeError
    qq, kk, vv = (t.double().requires_grad_(True) for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) / 8.0
    torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vv).backward(do.double())
    torch.testing.assert_close(b.dq.double(), qq.grad, atol=2e-2, rtol=2e-2)
    assert b.dsink is None and b.config.compile_key is not None


def test_a_feature_whose_keyword_the_release_lacks_is_unsupported_by_the_release_named(release):
    release()
    q, k, v, do = _tensors()
    f = adapter.forward(q, k, v, return_lse=True)
    with pytest.raises(adapter.UnsupportedByRelease) as ei:
        adapter.backward(q, k, v, f.out, do, f.lse, learnable_sink=torch.zeros(2))
    msg = str(ei.value)
    assert not isinstance(ei.value, TypeError)
    assert "learnable_sink=" in msg and "_flash_attn_bwd" in msg and "4.0.0b25" in msg
    assert "unsupported by this FA4 release" in msg
    # through the target: an unsupported problem, named, never "FA4 rejected the call"
    t = ProductionTarget(adapter=adapter, device="cpu")
    p = _problem(sink=True)
    a = p.materialize()
    fwd = t.forward(p, a)
    with pytest.raises(Unsupported, match=r"learnable_sink= unsupported by this FA4 release") as ei:
        t.backward(p, a, fwd)
    assert "FA4 rejected" not in str(ei.value)


def test_a_renamed_function_is_fa4verifys_error_never_a_violation(release):
    release(bwd_name="_flash_attn_backward")
    from fa4verify.fuzz.properties import check_problem
    t = ProductionTarget(adapter=adapter, device="cpu")
    p = _problem()
    with pytest.raises(HarnessError, match="has no _flash_attn_bwd"):
        check_problem(p, t, properties=("runs", "fwd_budget", "bwd_budget"))


def test_fa4s_own_refusal_is_fa4_rejected_the_call(release):
    release(only_hd64=True)
    t = ProductionTarget(adapter=adapter, device="cpu")
    p = _problem(hd=128)
    with pytest.raises(Unsupported, match="^FA4 rejected the call: AssertionError: this FA4 release runs head dim 64"):
        t.forward(p, p.materialize())


def test_a_typeerror_at_fa4s_call_site_is_fa4verifys(release, monkeypatch):
    """Without the signature reading (the b019845 adapter), the TypeError raised at the call is
    fa4verify's, not FA4's refusal."""
    release()
    monkeypatch.setattr(adapter, "_accepted_kwargs", lambda fn, kw: dict(kw))
    q, k, v, do = _tensors()
    f = adapter.forward(q, k, v, return_lse=True)
    try:
        adapter.backward(q, k, v, f.out, do, f.lse, learnable_sink=torch.zeros(2))
    except TypeError as e:
        assert blame.origin(e) == blame.FA4VERIFY and not blame.fa4_refusal(e)
    else:
        raise AssertionError("the fake release took learnable_sink")
    t = ProductionTarget(adapter=adapter, device="cpu")
    p = _problem(sink=True)
    a = p.materialize()
    fwd = t.forward(p, a)
    with pytest.raises(HarnessError, match="fa4verify's own call failed"):
        t.backward(p, a, fwd)


# --------------------------------------------------------------------- campaigns and checks
def _campaign(problems, target):
    from fa4verify.checks.fuzz import _result
    from fa4verify.fuzz import drawn
    part = drawn.run_drawn(problems, range(len(problems)), target=target,
                           properties=("runs", "fwd_budget", "bwd_budget"))
    res = drawn.merge_drawn([part], expected=len(problems), arch="sm90", profile="ci", seed=0)
    return res, _result(res, "CPU")


def test_a_campaign_on_a_renamed_backward_is_an_error_never_pass_or_fail(release):
    release(bwd_name="_flash_attn_backward")
    res, r = _campaign([_problem(seed=i) for i in range(3)], ProductionTarget(adapter=adapter, device="cpu"))
    assert sum(res.errors.values()) == 3 and res.examples_run == 0
    assert r.status == "error" and "fa4verify's own call failed on 3 example(s)" in r.summary


def test_a_campaign_that_judged_few_of_its_draw_is_undecided_with_the_counts(release):
    release(only_hd64=True)
    probs = [_problem(hd=64, seed=0), _problem(hd=64, seed=1)] + [_problem(hd=128, seed=i) for i in range(10)]
    res, r = _campaign(probs, ProductionTarget(adapter=adapter, device="cpu"))
    assert res.examples_run == 2 and sum(res.unsupported.values()) == 10
    assert r.status == "undecided", r.summary
    assert "judged 2 of 12 drawn examples (10 unsupported)" in r.summary
    assert "FA4 rejected the call" in r.summary


def test_the_same_campaign_judging_its_whole_draw_passes(release):
    """The share rule is what makes the campaign above undecided: judged in full, it passes."""
    release()
    res, r = _campaign([_problem(hd=64, seed=i) for i in range(10)], ProductionTarget(adapter=adapter, device="cpu"))
    assert res.examples_run == 10 and r.status == "pass", r.summary


def test_head_dims_live_does_not_blame_fa4_for_fa4verifys_error(release):
    from fa4verify import hd_sweep
    from fa4verify.checks import production
    release(bwd_name="_flash_attn_backward")
    rows = [hd_sweep.measure(adapter, hd, 64, 64, device="cpu") for hd in (64, 128)]
    assert all(r.get("blame") == "fa4verify" for r in rows)
    r = production._head_dim_result(rows, "CPU", "4.0.0b25")
    assert r.status == "error" and "backward raises" not in r.summary


def test_determinism_that_errored_is_not_not_reproducible(release):
    from fa4verify import determinism as d
    from fa4verify.audit.registry import CheckContext
    from fa4verify.checks import determinism as D
    release(bwd_name="_flash_attn_backward")
    be = object.__new__(d.Fa4Backend)
    be.adapter = adapter
    cfg = d.select_configs(["mha-hd64-kv-tiles"])[0]
    rec = d.run_config(be, cfg, "cpu", runs=2, default_runs=0)
    assert rec["status"] == "error", rec
    pay = {"records": [dict(results=[rec], arch="sm90", where="CPU", process_index=0)], "where": "CPU",
           "environment": {}, "configs": [cfg.name]}
    ctx = CheckContext(profile="quick", check_id="determinism.fa4", dtype="bf16")
    out = D._fa4_summary(ctx, [pay], [cfg])
    assert out.status == "error", out.summary
    assert "NOT reproducible" not in out.summary and "errored, nothing measured" in out.summary


def test_an_asynchronous_device_fault_is_fa4s_wherever_it_surfaces():
    """A CUDA fault of FA4's kernel surfaces at the next synchronisation, often fa4verify's copy
    of the output: it is FA4's (a crash: the judge's runs property), never fa4verify's error."""
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    except RuntimeError as e:
        assert blame.origin(e) == blame.FA4 and not blame.fa4_refusal(e)
    try:
        raise RuntimeError("CUDA error: out of memory")
    except RuntimeError as e:
        assert blame.origin(e) == blame.FA4VERIFY
