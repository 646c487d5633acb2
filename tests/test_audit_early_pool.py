"""Note [Workers before the CUDA probe] (fa4verify/cli/audit.py): a GPU audit's worker pool
starts from the raw options before ``build_config`` imports torch to probe CUDA, only when
nvidia-smi lists a GPU, is closed on every usage error, and is replaced when the real
configuration asks for another pool. CPU tests: the pool and nvidia-smi are fakes."""
from __future__ import annotations

import os

import pytest

import fa4verify.run.pool as pool_mod
import fa4verify.cli.audit as cli_audit
from fa4verify.cli import main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
OK = os.path.join(FIX, "audit_checks_ok.py")


class FakePool:
    made: list["FakePool"] = []

    def __init__(self, config):
        self.size, self.timeout, self.kernel_cache = config.workers, config.timeout, config.kernel_cache
        self.device = config.device
        self.closed = 0
        FakePool.made.append(self)

    @classmethod
    def for_audit(cls, config, size=None):
        return cls(config)

    def close(self):
        self.closed += 1


@pytest.fixture
def fakes(monkeypatch):
    FakePool.made = []
    monkeypatch.setattr(pool_mod, "WorkerPool", FakePool)
    monkeypatch.setattr(pool_mod, "_visible_compute_cap", lambda env: "90")
    # the real build finds no CUDA, also on a GPU machine (the tests below need that)
    import fa4verify._options as opts
    monkeypatch.setattr(opts, "cuda_available", lambda: False)
    return FakePool


def _raw(**kw):
    d = dict(dtype="bf16", device="cuda", arch=("auto",), profile="default", seed=0, keyword=None,
             shard=None, checks_modules=(), no_default_checks=True, isolate="auto", timeout=0.0,
             opts=(), deployment=None, workers="auto", fresh_workers=False, kernel_cache="off")
    d.update(kw)
    return d


def test_the_early_pool_is_the_pool_the_gpu_config_asks_for(fakes):
    p = cli_audit._start_pool_early(_raw(workers="3", timeout=7.5))
    assert isinstance(p, FakePool) and (p.size, p.timeout, p.device) == (3, 7.5, "cuda")
    from fa4verify._options import build_config
    real = build_config(**_raw(workers="3", timeout=7.5), cuda=True)
    assert cli_audit._pool_fits(p, real)
    assert not cli_audit._pool_fits(p, build_config(**_raw(workers="4", timeout=7.5), cuda=True))
    assert not cli_audit._pool_fits(p, build_config(**_raw(workers="3", timeout=7.5, device="cpu")))


def test_no_early_pool_without_a_listed_gpu_or_for_a_cpu_audit(fakes, monkeypatch):
    assert cli_audit._start_pool_early(_raw(device="cpu")) is None
    assert cli_audit._start_pool_early(_raw(fresh_workers=True)) is None
    assert cli_audit._start_pool_early(_raw(isolate="never")) is None
    assert cli_audit._start_pool_early(_raw(workers="many")) is None     # the real build says why
    monkeypatch.setattr(pool_mod, "_visible_compute_cap", lambda env: None)
    assert cli_audit._start_pool_early(_raw()) is None
    assert cli_audit._start_pool_early(_raw(device="auto")) is None
    assert FakePool.made == []


def test_a_usage_error_after_the_early_start_closes_the_pool_and_exits_2(fakes, capsys):
    # this CPU machine has no CUDA: the real build refuses --device cuda after the pool started
    rc = main(["audit", "--no-default-checks", "--no-live", "--device", "cuda", "--checks-module", OK])
    assert rc == 2
    assert len(FakePool.made) == 1 and FakePool.made[0].closed == 1
    assert "no CUDA device" in capsys.readouterr().err


def test_a_pool_that_does_not_fit_the_real_config_is_closed(fakes, monkeypatch):
    # device auto on a machine without CUDA: the early pool (nvidia-smi faked) does not fit the
    # CPU configuration; it is closed and the audit runs as a CPU audit
    rc = main(["audit", "--no-default-checks", "--no-live", "--device", "auto", "--checks-module", OK])
    assert rc == 0
    assert len(FakePool.made) == 1 and FakePool.made[0].closed == 1


def test_an_interrupt_during_the_cuda_probe_closes_the_early_pool(fakes, monkeypatch):
    def interrupted(**kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_audit, "build_config", interrupted)
    monkeypatch.setattr(cli_audit, "_start_pool_early", lambda raw: FakePool.for_audit(
        __import__("fa4verify._options", fromlist=["build_config"]).build_config(**_raw(), cuda=True)))
    with pytest.raises(KeyboardInterrupt):
        cli_audit.command.callback(**{**_cli_defaults(), "device": "cuda"})
    assert len(FakePool.made) == 1 and FakePool.made[0].closed == 1


def _cli_defaults():
    import click
    ctx = click.Context(cli_audit.command)
    return {p.name: p.get_default(ctx) for p in cli_audit.command.params}


def test_an_empty_cuda_visible_devices_lists_no_gpu(monkeypatch):
    """CUDA_VISIBLE_DEVICES="" (or "-1") hides every GPU from CUDA, whatever nvidia-smi lists:
    no early pool, no QUACK_ARCH for the zygote (review, session 7)."""
    import subprocess

    def no_smi(*a, **k):
        raise AssertionError("nvidia-smi must not be asked")
    monkeypatch.setattr(subprocess, "run", no_smi)
    assert pool_mod._visible_compute_cap({"CUDA_VISIBLE_DEVICES": ""}) is None
    assert pool_mod._visible_compute_cap({"CUDA_VISIBLE_DEVICES": "-1"}) is None
