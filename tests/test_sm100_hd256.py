"""FA4's SM100 kernels at head dims (256, 256): which release runs a dedicated kernel for which
pass, and what follows for the twin, the plan, the fuzz and the targets (``facts.sm100_hd256_*``).

The pinned 4.0.0b36 runs the (256, 256) forward on its generic ``FlashAttentionForwardSm100``
(2-CTA, lazy rescale, every feature: compile-only, docs/b200.md) and only the backward on a
dedicated kernel, which asserts no score_mod (softcap), mask_mod, sink, local window or block
sparsity. 4.0.0b20..b33 also shipped a dedicated forward (``sm100_hd256_2cta_fmha_forward.py``)
with the same limits. Both cases are checked here, the older one on a fake source tree."""
import numpy as np
import pytest

from fa4verify.coverage.space import space_for
from fa4verify.kernels import facts
from fa4verify.kernels.twin import forward as twin_forward
from fa4verify.problem import AttentionProblem
from fa4verify.targets import _call_backward_unsupported, hd256_refusal


@pytest.fixture(autouse=True)
def _fresh_facts():
    """The facts read from FA4's files are cached per process: a test that fakes an older tree
    must not leave its answers to the next test."""
    yield
    for fn in (facts._source_text, facts._source_defines, facts.kernel_constants):
        fn.cache_clear()


def _hd256(sp):
    return next(n for n, v in sp.hd.items() if v == (256, 256))


def test_pinned_release_runs_the_hd256_forward_on_the_generic_kernel():
    assert not facts.sm100_hd256_dedicated("fwd") and facts.sm100_hd256_dedicated("bwd")
    kc = facts.kernel_constants("sm100", "bf16", 256, 256)
    assert (kc.kernel, kc.rescale_threshold) == ("sm100", facts.kernel_constants("sm100", "bf16", 128, 128).rescale_threshold)
    assert kc.rescale_threshold > 0                       # lazy rescale, as at hd 128
    assert facts.sm100_hd256_lacks("sm100", 256, 256, "fwd") == frozenset()
    assert facts.sm100_hd256_lacks("sm100", 256, 256, "bwd") == facts.HD256_DEDICATED_LACKS
    assert facts.sm100_hd256_lacks("sm90", 256, 256, "bwd") == frozenset()
    assert facts.sm100_hd256_lacks("sm100", 128, 128, "bwd") == frozenset()


def test_plan_runs_hd256_features_forward_only_where_the_backward_lacks_them():
    sp = space_for("sm100", "bf16")
    hd = _hd256(sp)
    assert "128" in sp.hd and sp.hd["128"] == (128, 128)    # (256, 256) is a class of its own
    row = {"hd": hd, "softcap": "on", "sink": "fp32", "mask": "left", "form": "dense"}
    assert sp.why_not(row) is None                       # the forward takes all of it
    why = sp.no_backward(row)
    assert why == facts.sm100_hd256_refusal("bwd", {"softcap", "sink", "local"}), why
    assert sp.passes(dict(row, gqa="1", seqlen="multi", det="on", values="normal")) == ("fwd",)
    plain = {"hd": hd, "softcap": "off", "sink": "off", "mask": "causal", "form": "dense"}
    assert sp.no_backward(plain) is None
    assert "dedicated" in sp.no_backward({"hd": hd, "form": "score_mod"})


def test_targets_refuse_only_the_hd256_backward_features():
    p = AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=130, seqlen_k=130, nheads=2, nheads_kv=2,
                         head_dim=256, head_dim_v=256, softcap=30.0, window_size=(64, 0))
    assert hd256_refusal(p, "fwd") is None
    assert _call_backward_unsupported(p) == facts.sm100_hd256_refusal("bwd", {"softcap", "local"})
    plain = AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=130, seqlen_k=130, nheads=2,
                             nheads_kv=2, head_dim=256, head_dim_v=256, causal=True)
    assert _call_backward_unsupported(plain) is None
    # the dedicated backward asserts no dlse: the dLSE pass asks first (Note [A gradient through the LSE])
    from fa4verify.targets import ProductionTarget
    assert ProductionTarget.dlse_unsupported(object(), plain) == facts.sm100_hd256_refusal("bwd", {"dlse"})
    assert ProductionTarget.dlse_unsupported(object(), plain.replace(head_dim=128, head_dim_v=128)) is None
    assert ProductionTarget.dlse_unsupported(object(), plain.replace(arch="sm90")) is None


def test_twin_runs_the_generic_sm100_forward_at_hd256():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 40, 1, 256)).astype(np.float32) for _ in range(3))
    import torch
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16).float().numpy() for x in (q, k, v))
    res = twin_forward.forward(q, k, v, arch="sm100", softcap=30.0, window_size=(16, 0))
    assert res.config.kernel == "sm100" and res.config.rescale_threshold > 0
    assert len(res.config.emulated_columns) > 0           # FA4's (True, *, 256) tuning row emulates


def _older_release(tmp_path, monkeypatch, *, generic_bwd_knob=False):
    d = tmp_path / "flash_attn" / "cute"
    d.mkdir(parents=True)
    for name in ("sm100_hd256_2cta_fmha_forward.py", "sm100_hd256_2cta_fmha_backward.py", "flash_fwd_sm100.py"):
        (d / name).write_text("# fake\n")
    (d / "utils.py").write_text("def _get_hd256_generic_bwd():\n    pass\n" if generic_bwd_knob else "# fake\n")
    monkeypatch.setattr("fa4verify.kernels.fa4_params.fa4_source_dir", lambda: d)
    facts._source_text.cache_clear()
    facts._source_defines.cache_clear()
    facts.kernel_constants.cache_clear()
    return d


def test_a_release_with_a_dedicated_hd256_forward_refuses_its_features(tmp_path, monkeypatch):
    sp = space_for("sm100", "bf16")
    hd = _hd256(sp)
    _older_release(tmp_path, monkeypatch)
    assert facts.sm100_hd256_dedicated("fwd") and facts.sm100_hd256_dedicated("bwd")
    assert facts.sm100_hd256_lacks("sm100", 256, 256, "fwd") == facts.HD256_DEDICATED_LACKS
    why = sp.why_not({"hd": hd, "softcap": "on", "form": "block_sparse"})
    assert why == facts.sm100_hd256_refusal("fwd", {"softcap", "block_sparse"}), why
    p = AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=130, seqlen_k=130, nheads=2, nheads_kv=2,
                         head_dim=256, head_dim_v=256, sink=True)
    assert hd256_refusal(p, "fwd") == facts.sm100_hd256_refusal("fwd", {"sink"})
    from fa4verify._strategies.problem import _arch_features
    assert {"softcap", "sink", "local", "mask_mod", "block_sparse"} <= _arch_features("sm100", 256, 256)


def test_the_generic_backward_knob_counts_only_where_the_release_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH_ATTENTION_HD256_GENERIC_BWD", "1")
    _older_release(tmp_path, monkeypatch)                       # no _get_hd256_generic_bwd: knob ignored
    assert facts.sm100_hd256_dedicated("bwd")
    facts._source_text.cache_clear()
    facts._source_defines.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("FLASH_ATTENTION_HD256_GENERIC_BWD", "1")
    _older_release(tmp_path / "b", monkeypatch, generic_bwd_knob=True)
    assert not facts.sm100_hd256_dedicated("bwd")
    assert facts.sm100_hd256_lacks("sm100", 256, 256, "bwd") == frozenset()
