"""The race harness (Note [Backward under load]) on the CPU against a fake FA4 release: the
plumbing (dO re-produced before the backward, every repetition judged, deterministic repetitions
compared bitwise) passes a correct release and fails one whose deterministic backward is not."""
from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

from fa4verify import races  # noqa: E402
from fa4verify.kernels import adapter  # noqa: E402


@pytest.fixture()
def fake_release(tmp_path, monkeypatch):
    path = os.path.join(os.path.dirname(__file__), "fixtures", "fake_fa4_release.py")
    spec = importlib.util.spec_from_file_location("fake_fa4_release_fixture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fake = mod.load(tmp_path)
    monkeypatch.setattr(adapter, "fa4_interface", lambda: fake)
    monkeypatch.setattr(adapter, "_require_cuda", lambda: None)
    return fake


def _small():
    from fa4verify._strategies.problem import AttentionProblem
    from fa4verify._strategies.values import ValueSpec
    return [AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=64, seqlen_k=96, nheads=4, nheads_kv=2,
                             head_dim=64, head_dim_v=64, causal=True, values=ValueSpec("normal", 3))]


def test_a_correct_backward_passes_under_the_harness(fake_release):
    from fa4verify.checks.races import result
    t = races.RacingTarget(adapter=adapter, device="cpu")
    rows = {"deterministic": races.run_races(t, _small(), reps=3, deterministic=True)}
    assert rows["deterministic"][0].judged == 3 and rows["deterministic"][0].bitwise_mismatches == 0
    assert result(rows, "CPU", {}).status == "pass"


def test_a_backward_that_differs_between_repetitions_fails(fake_release, monkeypatch):
    """A deterministic backward whose bits change between repetitions (what a missed wait under
    load does) is caught by the bitwise comparison even when each result is within budget."""
    from fa4verify.checks.races import result
    real = fake_release._flash_attn_bwd
    n = {"i": 0}

    import functools

    @functools.wraps(real)          # the release's signature: the adapter passes only what it takes
    def flaky(*a, **kw):
        dq, dk, dv = real(*a, **kw)
        n["i"] += 1
        if n["i"] % 2 == 0:
            dq = (dq.float() * (1 + 2.0 ** -7)).to(dq.dtype)      # one bf16 ulp-ish, within budget
        return dq, dk, dv
    flaky.compile_cache = real.compile_cache
    monkeypatch.setattr(fake_release, "_flash_attn_bwd", flaky)
    t = races.RacingTarget(adapter=adapter, device="cpu")
    rows = {"deterministic": races.run_races(t, _small(), reps=3, deterministic=True)}
    r = result(rows, "CPU", {})
    assert r.status == "fail" and rows["deterministic"][0].bitwise_mismatches >= 1, r.summary


def test_race_problems_cover_dense_gqa_and_block_sparse():
    ps = races.race_problems("sm90")
    assert any(p.nheads != p.nheads_kv for p in ps) and any(p.call is not None and p.call.block_size for p in ps)


@pytest.mark.fa4
def test_pdl_is_read_from_the_installed_source():
    assert races.pdl_in_source().get("flash_bwd_preprocess.py") is True


@pytest.mark.fa4
@pytest.mark.parametrize("mutant", races.RACE_MUTANTS, ids=lambda m: m.id)
def test_each_planted_dropped_wait_applies_to_the_installed_source(tmp_path, mutant):
    from fa4verify import source_mutants as sm
    env = races.plant(mutant.id, tmp_path / "copy")
    root = tmp_path / "copy" / "flash_attn" / "cute"
    for e in mutant.edits:
        installed = (sm.installed_root() / "cute" / e.file).read_text()
        patched = (root / e.file).read_text()
        assert installed.count(e.old) == 1 and e.old not in patched and e.new in patched
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "copy")


def test_plant_refuses_an_unknown_mutant_in_one_line(tmp_path, capsys):
    assert races._main(["plant", "nope", str(tmp_path)]) == 2
    assert "race mutant 'nope'" in capsys.readouterr().err
