"""Shared option parsing (fa4verify._options): device/arch resolution, shards, opts."""
from __future__ import annotations

import pytest

from fa4verify import _options as o
from fa4verify import errors


@pytest.mark.parametrize("device, cuda, want", [
    ("auto", False, "cpu"), ("auto", True, "cuda"), ("cpu", True, "cpu"), ("cuda", True, "cuda"),
])
def test_device_resolution(device, cuda, want):
    assert o.resolve_device(device, cuda=cuda) == want


def test_device_cuda_without_gpu_is_an_error():
    with pytest.raises(errors.OptionError, match=r"no CUDA device \(torch.cuda.is_available\(\) is False\)"):
        o.resolve_device("cuda", cuda=False)


def test_arch_auto_is_both_twins_on_cpu_and_the_gpu_arch_on_cuda(monkeypatch):
    assert o.resolve_archs(["auto"], "cpu") == ("sm90", "sm100")
    monkeypatch.setattr(o, "_gpu_arch", lambda: "sm100")
    assert o.resolve_archs(["auto"], "cuda") == ("sm100",)
    assert o.resolve_archs(["sm103", "sm90,sm103"], "cpu") == ("sm103", "sm90")


@pytest.mark.parametrize("text, want", [(None, None), ("1/1", (1, 1)), ("2/3", (2, 3))])
def test_shard_parsing(text, want):
    assert o.parse_shard(text) == want


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "1", "1/2/3"])
def test_bad_shards(text):
    with pytest.raises(errors.OptionError, match="--shard"):
        o.parse_shard(text)


def test_env_var_adds_check_modules(monkeypatch):
    monkeypatch.setenv(o.CHECKS_MODULES_ENV, "a.b:c/d.py")
    cfg = o.build_config(device="cpu", checks_modules=["x.y", "a.b"])
    assert cfg.checks_modules == ("x.y", "a.b", "c/d.py")


def test_opts_and_negative_seed():
    assert o.build_config(device="cpu", opts=["k=v=w", "a=1"]).opts == (("a", "1"), ("k", "v=w"))
    with pytest.raises(errors.OptionError, match="--opt"):
        o.build_config(device="cpu", opts=["novalue"])
    with pytest.raises(errors.OptionError, match="--seed"):
        o.build_config(device="cpu", seed=-1)
