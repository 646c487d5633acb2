"""Deployment profiles: the shipped ones load, malformed ones are one-line errors, and the cases
they generate stay inside what they ship (CPU)."""
from __future__ import annotations

import pytest

from fa4verify import deployment as D
from fa4verify.kernels import facts
from fa4verify import errors


@pytest.mark.parametrize("name", ["llama3-8b", "swa-sink-hd64", "hd256", "small-hd", "decode-paged"])
def test_shipped_profiles_load_and_round_trip(name):
    d = D.load(name)
    assert d.name == name and d.description
    assert D.Deployment.from_dict(d.to_dict()) == d
    assert "huge" not in d.distributions


def test_llama3_shape():
    d = D.load("llama3-8b")
    assert d.head_dims == ((128, 128),) and d.nheads == (32,) and d.nheads_kv == (8,)
    assert d.masks == ("causal",) and d.dtypes == ("bf16",) and d.seqlen_k == (1, 8192)
    assert d.covers(head_dim=128, causal=True, seqlen_q=4096)
    assert not d.covers(head_dim=64, causal=True) and not d.covers(head_dim=128, causal=False)
    assert not d.covers(head_dim=128, causal=True, seqlen_q=16384)


@pytest.mark.parametrize("arch", facts.ARCHS)
def test_live_cases_are_supported_by_fa4_and_inside_the_profile(arch):
    for name in ("llama3-8b", "swa-sink-hd64", "hd256", "small-hd", "decode-paged"):
        d = D.load(name)
        for c in d.live_cases(arch=arch, dtype="bf16", seqlens=(512, 100000)):
            assert facts.head_dims_supported(arch, c["head_dim"], c["head_dim_v"])
            assert (c["head_dim"], c["head_dim_v"]) in d.head_dims
            assert d.seqlen_q[0] <= c["seqlen"] <= d.seqlen_q[1]
            assert ("causal" if c["causal"] else ("window" if c["window_size"] != (None, None) else "none")) in d.masks


def test_strategy_draws_only_shipped_head_dims():
    from hypothesis import given, settings

    from fa4verify._strategies.problem import attention_problems
    kw = D.load("small-hd").strategy_kwargs()
    seen = set()

    @settings(max_examples=25, deadline=None, database=None)
    @given(attention_problems(arch="sm90", features=kw["features"], distributions=kw["distributions"],
                              **kw["limits"]))
    def body(p):
        seen.add(p.head_dim)
        assert p.head_dim in (8, 40, 80) and p.values.distribution != "huge"
    body()
    assert seen


@pytest.mark.parametrize("text, match", [
    ("description = 'x'", "name must be a non-empty string"),
    ("name = 'x'\nhead_dims = [0]", "head_dims must be positive integers"),
    ("name = 'x'\nmasks = ['diagonal']", "masks"),
    ("name = 'x'\nmasks = ['window']", "needs window_sizes"),
    ("name = 'x'\nsoftcap = -1.0", "softcap"),
    ("name = 'x'\nsinks = true\nsink_dtype = 'fp64'", "sink_dtype 'fp64': choose from fp32, bf16, fp16"),
    ("name = 'x'\nsink_dtype = 'bf16'", "sink_dtype needs sinks = true"),
    ("name = 'x'\nsoftmax_scales = [0.0]", "softmax_scales 0.0 must be finite and in"),
    ("name = 'x'\nsoftmax_scales = []", "softmax_scales is empty"),
    ("name = 'x'\nsoftmax_scales = ['a']", "softmax_scales 'a' must be"),
    ("name = 'x'\nseqlen_q = [10, 1]", "needs 0 <= min <= max"),
    ("name = 'x'\nseqlen_k = [0, 8]", "minimum 0 .empty sequences. needs varlen"),
    ("name = 'x'\nnheads = 6\nnheads_kv = 4", "not a multiple"),
    ("name = 'x'\ndtypes = ['fp4']", "dtypes"),
    ("name = 'x'\nbogus = 1", "unknown key"),
    ("name = 'x'\ndistributions = ['gaussian']", "distributions"),
    ("name = 'x'\nfeatures = ['paged']", "features .'paged'.: choose from seqused_k, seqused_q, paged_kv"),
    ("name = 'x'\npage_sizes = [16]", "page_sizes needs"),
    ("name = 'x'\nfeatures = ['seqused_k']\nnan_pages = true", "nan_pages needs"),
    ("name = 'x'\nfeatures = ['paged_kv']\npage_sizes = [0]", "page_sizes must be positive"),
    ("name = [", "not valid TOML"),
])
def test_malformed_profiles_are_one_line_errors(tmp_path, text, match):
    p = tmp_path / "d.toml"
    p.write_text(text)
    with pytest.raises(errors.DeploymentError, match=match) as ei:
        D.load(p)
    assert "\n" not in str(ei.value)


def test_cli_rejects_a_missing_or_mismatched_profile(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--deployment", str(tmp_path / "none.toml"),
                        "--list"], capture_output=True, text=True)
    assert r.returncode == 2 and "no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--deployment", "llama3-8b", "--dtype", "fp16",
                        "--list"], capture_output=True, text=True)
    assert r.returncode == 2 and "ships bf16, not --dtype fp16" in r.stderr
