"""Note [Sink dtype of a release] on the CPU: FA4 4.0.0b20..b25 take a bfloat16 ``learnable_sink``
only; fa4verify's sinks are float32 with bf16-exact values. Against a fake release whose forward
asserts a bfloat16 sink (``tests/fixtures/fake_fa4_release.py``, ``bf16_sink``), the sink forward
runs and is judged (never "FA4 rejected the call"), a sink that bfloat16 cannot hold exactly is
"unsupported by this FA4 release", named, and a release that takes float32 gets the sink as given."""
from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

from fa4verify.errors import Unsupported  # noqa: E402
from fa4verify.kernels import adapter  # noqa: E402
from fa4verify.problem import AttentionProblem, ValueSpec  # noqa: E402
from fa4verify.targets import ProductionTarget  # noqa: E402


def _fixture():
    path = os.path.join(os.path.dirname(__file__), "fixtures", "fake_fa4_release.py")
    spec = importlib.util.spec_from_file_location("fake_fa4_release_fixture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def release(tmp_path, monkeypatch):
    def install(**kw):
        mod = _fixture().load(tmp_path, **kw)
        monkeypatch.setattr(adapter, "fa4_interface", lambda: mod)
        monkeypatch.setattr(adapter, "_require_cuda", lambda: None)
        monkeypatch.setattr(adapter, "_dist_version", lambda name: "4.0.0b25" if name == "flash-attn-4" else None)
        return mod
    return install


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 64, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_a_bf16_only_release_gets_the_sink_in_bf16(release):
    mod = release(bf16_sink=True)
    seen = []
    orig = mod._flash_attn_fwd

    def spy(*a, **kw):
        seen.append(a[8] if len(a) > 8 else kw.get("learnable_sink"))
        return orig(*a, **kw)
    spy.compile_cache = orig.compile_cache
    mod.flash_attn_func.__globals__["_flash_attn_fwd"] = spy
    q, k, v = _qkv()
    sink = torch.tensor([0.5, -1.25])                  # float32, bf16-exact
    f = adapter.forward(q, k, v, learnable_sink=sink, return_lse=True)
    assert seen and seen[-1].dtype == torch.bfloat16 and torch.equal(seen[-1].float(), sink)
    assert f.out.shape == q.shape
    # a sink bfloat16 cannot hold: named, unsupported by this release (never FA4's refusal)
    with pytest.raises(adapter.UnsupportedByRelease, match=r"learnable_sink in bfloat16 only.*float32 sink"):
        adapter.forward(q, k, v, learnable_sink=torch.tensor([0.1, 0.2]), return_lse=True)


def test_the_target_judges_a_sink_problem_on_a_bf16_only_release(release):
    release(bf16_sink=True)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=64, seqlen_k=64, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, sink=True, values=ValueSpec("normal", 0))
    t = ProductionTarget(adapter=adapter, device="cpu")
    a = p.materialize()
    fwd = t.forward(p, a)                             # before the fix: "FA4 rejected the call"
    assert fwd is not None
    with pytest.raises(Unsupported, match="learnable_sink= unsupported by this FA4 release"):
        t.backward(p, a, fwd)                         # b20..b25 have no sink backward


def test_a_release_taking_float32_gets_the_sink_as_given(release):
    mod = release()
    mod._LEARNABLE_SINK_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
    sink = torch.tensor([0.1, 0.2])
    assert adapter._release_sink(sink) is sink
