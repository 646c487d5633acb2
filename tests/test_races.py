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
    from fa4verify.problem import AttentionProblem, ValueSpec
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
    from fa4verify.mutants import source as sm
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


# ----------------------------------------------------------------------- the audit check (map / reduce)
def _ctx(profile="default", options=None, deployment=None, dtype="bf16"):
    from fa4verify.audit.registry import CheckContext
    return CheckContext(profile=profile, check_id="races.production", dtype=dtype, options=dict(options or {}),
                        deployment=deployment.to_dict() if deployment is not None else None)


@pytest.fixture()
def on_cpu(monkeypatch):
    """The check with its GPU stand-in: the CPU device (the stand-in adapter), the small problems."""
    from fa4verify.checks import races as check
    monkeypatch.setattr(check, "_DEVICE", "cpu")
    monkeypatch.setattr(races, "race_problems", lambda arch, dtype="bf16", seed=0: _small() + [
        _small()[0].replace(nheads=2, nheads_kv=2, causal=False), _small()[0].replace(head_dim=128, head_dim_v=128)])
    return check


def _kinds(cases):
    from fa4verify.checks.races import PdlOffCase, RaceCase
    return ([c for c in cases if isinstance(c, RaceCase)], [c for c in cases if isinstance(c, PdlOffCase)])


def test_the_default_audit_runs_a_short_race_run_and_full_adds_pdl_off(on_cpu):
    spec = on_cpu.production.__fa4verify_check__
    assert "default" in spec.profiles and spec.cases is not None and spec.summarise is not None
    on, off = _kinds(on_cpu._cases(_ctx("default")))
    assert len(on) == 4 and not off                              # 2 problems x 2 modes, PDL as FA4 ships it
    assert {c.reps for c in on} == {3} and {c.mode for c in on} == {"deterministic", "default"}
    on_f, off_f = _kinds(on_cpu._cases(_ctx("full")))
    assert len(on_f) == 6 and len(off_f) == 1 and off_f[0].reps == 8 and len(off_f[0].problems) == 3
    assert _kinds(on_cpu._cases(_ctx("default", {"races_pdl": "off"})))[0] == []
    with pytest.raises(ValueError, match="races_pdl"):
        on_cpu._cases(_ctx("default", {"races_pdl": "sometimes"}))
    with pytest.raises(ValueError, match="races_reps"):
        on_cpu._cases(_ctx("default", {"races_reps": "1"}))


def test_the_engine_groups_a_problems_modes_and_gives_the_pdl_off_run_a_task_of_its_own(on_cpu):
    from fa4verify.run.engine import Job, plan
    spec = on_cpu.production.__fa4verify_check__
    ctx = _ctx("full")
    job = Job(spec=spec, ctx=ctx, cases=on_cpu._cases(ctx))
    tasks = plan([job])
    on, off = _kinds(job.cases)
    assert len(tasks) == 3 + 1                      # one per problem (its two modes share the key) + PDL off
    assert sorted(len(t.cases) for t in tasks) == [1, 2, 2, 2]


def test_a_deployment_narrows_the_race_problems(on_cpu):
    from fa4verify.deployment import Deployment
    dep = Deployment.from_mapping({"name": "t", "head_dims": [64], "nheads": 8, "nheads_kv": 2, "masks": ["causal"],
                                   "seqlen_q": [1, 256], "seqlen_k": [1, 256], "dtypes": ["bf16"]})
    for profile in ("default", "full"):
        on, off = _kinds(on_cpu._cases(_ctx(profile, deployment=dep)))
        ps = [c.problem for c in on] + [p for c in off for p in c.problems]
        assert ps and all(p.head_dim == 64 and p.causal and p.nheads // p.nheads_kv == 4 and p.seqlen_q <= 256
                          and p.seqlen_k <= 256 and p.call is None for p in ps), [p.describe() for p in ps]
    sparse = Deployment.from_mapping({"name": "s", "head_dims": [128], "masks": ["none"], "features": ["block_sparse"]})
    on, _ = _kinds(on_cpu._cases(_ctx("full", deployment=sparse)))
    assert any(c.problem.call is not None and c.problem.call.block_size for c in on)
    fp16 = Deployment.from_mapping({"name": "h", "dtypes": ["fp16"]})
    from fa4verify.audit.registry import SkipCheck
    with pytest.raises(SkipCheck, match="fp16"):
        on_cpu._cases(_ctx("default", deployment=fp16))


def test_the_check_passes_a_correct_release_and_fails_a_repetition_dependent_one(on_cpu, fake_release, monkeypatch):
    from fa4verify.run.engine import run_here
    spec = on_cpu.production.__fa4verify_check__
    r = run_here(spec, _ctx("default", {"races_reps": "2"}))
    assert r.status == "pass", r.summary
    assert r.metrics["judged"] == r.metrics["reps"] == 2 * 2 * 2 and "PDL on" in r.summary
    real = fake_release._flash_attn_bwd
    n = {"i": 0}
    import functools

    @functools.wraps(real)
    def flaky(*a, **kw):
        dq, dk, dv = real(*a, **kw)
        n["i"] += 1
        if n["i"] % 2 == 0:
            dq = (dq.float() * (1 + 2.0 ** -7)).to(dq.dtype)
        return dq, dk, dv
    flaky.compile_cache = real.compile_cache
    monkeypatch.setattr(fake_release, "_flash_attn_bwd", flaky)
    r = run_here(spec, _ctx("default", {"races_reps": "2"}))
    assert r.status == "fail" and r.metrics["bitwise_mismatches"] >= 1, r.summary


# ----------------------------------------------------------------------- PDL off (Note [PDL off])
@pytest.fixture()
def dsl_launch(monkeypatch):
    """The CuTe DSL's launch entry point replaced by a spy (restored after the test)."""
    import cutlass.cutlass_dsl.cutlass as dsl          # the tests using it are marked fa4
    seen = []

    def spy(*a, **kw):
        seen.append(kw.get("use_pdl"))
        return "launched"
    monkeypatch.setattr(dsl.CutlassBaseDSL, "cuda_launch_func", staticmethod(spy))
    monkeypatch.setattr(races, "_PDL_FORCED_OFF", False)
    return dsl, seen


@pytest.mark.fa4
def test_force_pdl_off_launches_every_kernel_without_pdl(dsl_launch):
    dsl, seen = dsl_launch
    dsl.CutlassBaseDSL.cuda_launch_func([], None, 1, 1, 1, 1, 1, 1, [], use_pdl=True)
    races.force_pdl_off()
    races.force_pdl_off()                                   # once is enough: not wrapped twice
    assert dsl.CutlassBaseDSL.cuda_launch_func([], None, 1, 1, 1, 1, 1, 1, [], use_pdl=True) == "launched"
    assert seen == [True, False]


def test_the_pdl_off_run_has_a_kernel_cache_of_its_own():
    on = "/cache/fa4"
    off = races.pdl_off_env({"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": on})["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    assert off != on and not off.startswith(on + os.sep) and off.endswith(races.PDL_OFF_CACHE_SUFFIX)
    default = races.pdl_off_env({})["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    assert default.endswith("flash_attention_cute_dsl_cache" + races.PDL_OFF_CACHE_SUFFIX)


@pytest.mark.fa4
def test_the_pdl_off_call_runs_with_pdl_off_and_refuses_a_process_that_compiled_before(dsl_launch, fake_release,
                                                                                        monkeypatch):
    from fa4verify.errors import HarnessError
    monkeypatch.setattr(races, "RacingTarget",
                        lambda busy=True: _ORIGINAL_TARGET(adapter=adapter, device="cpu", busy=busy))
    payload = {"problems": [p.to_dict() for p in _small()], "reps": 2, "modes": [["deterministic", True]]}
    out = races._pdl_off_call(payload)
    assert races._PDL_FORCED_OFF and "forced off" in out["target"]["pdl"]
    r, = out["rows"]["deterministic"]
    assert r.judged == 2 and r.bitwise_mismatches == 0
    monkeypatch.setattr(races, "_compiled_kernels", lambda: 1)
    with pytest.raises(HarnessError, match="compiled before"):
        races._pdl_off_call(payload)


_ORIGINAL_TARGET = races.RacingTarget


def test_the_check_reports_pdl_on_and_off(on_cpu, fake_release, monkeypatch):
    """The PDL-off case's rows join the verdict under their own mode name (the fresh process is
    replaced here by the in-process call: the fake release lives only in this process)."""
    from fa4verify.run.engine import run_here
    monkeypatch.setattr(races, "run_races_pdl_off", lambda ps, reps, modes, timeout_s=None: {
        "rows": {m: races.run_races(_ORIGINAL_TARGET(adapter=adapter, device="cpu"), ps, reps=reps, deterministic=d)
                 for m, d in modes}, "target": {"pdl": "forced off"}, "kernel_cache": "/x-pdl-off"})
    r = run_here(on_cpu.production.__fa4verify_check__, _ctx("default", {"races_reps": "2", "races_pdl": "both"}))
    assert r.status == "pass", r.summary
    modes = {row[0] for row in r.details["table"]["rows"]}
    assert modes == {"deterministic, PDL on", "default, PDL on", "deterministic, PDL off", "default, PDL off"}
    assert "PDL off and on" in r.summary and r.details["target"]["PDL off"]["kernel_cache"] == "/x-pdl-off"


_LAUNCHES = """
import json, os, sys
from fa4verify.kernels.adapter import install_compile_only_shims
install_compile_only_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
from cutlass.cutlass_dsl import cutlass as dsl
seen = []
orig = dsl.CutlassBaseDSL.cuda_launch_func
def spy(*a, **kw):                        # what the DSL's launch builder receives
    seen.append(bool(kw.get("use_pdl")))
    return orig(*a, **kw)
dsl.CutlassBaseDSL.cuda_launch_func = staticmethod(spy)
from fa4verify import races
if sys.argv[1] == "off":
    races.force_pdl_off()
from fa4verify.problem import AttentionProblem
from fa4verify.targets import ProductionTarget
p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=128, seqlen_k=128, nheads=2, nheads_kv=2,
                     head_dim=64, head_dim_v=64, causal=True)
a = p.materialize()
t = ProductionTarget(fake=True)
f = t.forward(p, a)
n = len(seen)
t.backward(p, a, f, deterministic=False)
print(json.dumps(seen[n:]))
"""


@pytest.mark.fa4
@pytest.mark.parametrize("pdl", ["on", "off"])
def test_compile_only_the_sm90_backward_launches_with_pdl_unless_forced_off(tmp_path, pdl):
    """Compile-only (sm_90a, no GPU): the installed FA4's backward asks the CuTe DSL for PDL
    launches (preprocess, main kernel; the postprocess without), and after :func:`force_pdl_off`
    the DSL builds every one of them without (Note [PDL off])."""
    import json
    import subprocess
    import sys

    from fa4verify.compile.census import compile_env
    (tmp_path / "dump").mkdir()
    env = compile_env("sm_90a", tmp_path / "dump", tmp_path / "dsl-cache", keep="ptx")
    cp = subprocess.run([sys.executable, "-c", _LAUNCHES, pdl], env=env, capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, cp.stderr[-3000:]
    launches = json.loads(cp.stdout.strip().splitlines()[-1])
    assert len(launches) == 3, launches                       # preprocess, main kernel, dQ postprocess
    assert launches == ([True, True, False] if pdl == "on" else [False, False, False])
