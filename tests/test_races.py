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


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_a_race_problem_leaves_whole_poisoned_tiles_past_the_used_rows_of_a_sink_call(arch):
    """Red-team round 16 #8: dsink's loop over a sequence's rows to the Q capacity instead of
    seqused_q reads rows FA4's preprocess never wrote; under the poison they hold NaN only where a
    whole M tile (at most 128 rows) lies past each sequence's used rows rounded to its tile."""
    from fa4verify.kernels import facts
    p = next(p for p in races.race_problems(arch) if p.call is not None and p.call.seqused_q)
    assert p.sink and p in races.race_problems(arch)[:3]          # in the default profile
    tm = max(facts.bwd_tile(arch, p.head_dim, p.head_dim_v, False, False)[0], 128)
    assert all(-(-n // tm) * tm + tm <= p.call.q_capacity for n in p.seqlens_q)


@pytest.mark.fa4
def test_pdl_is_read_from_the_installed_source():
    assert races.pdl_in_source().get("flash_bwd_preprocess.py") is True


def test_pdl_in_source_reads_code_not_comments_and_any_launch_value_but_false(tmp_path, monkeypatch):
    from fa4verify.kernels import fa4_params
    files = {"flash_bwd_preprocess.py": "    launch(use_pdl=self.use_pdl)\n",
             "flash_bwd_sm90.py": "        kernel.launch(grid=g, use_pdl=pdl_flag)\n",
             "flash_bwd_sm100.py": "    # launched with use_pdl=True one day\n    launch(use_pdl=False)\n",
             "flash_bwd_postprocess.py": "    self.use_pdl = True\n    def f(use_pdl: bool = False): pass\n"}
    for f, text in files.items():
        (tmp_path / f).write_text(text)
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    assert races.pdl_in_source() == {"flash_bwd_preprocess.py": True, "flash_bwd_sm90.py": True,
                                     "flash_bwd_sm100.py": False, "flash_bwd_postprocess.py": False}


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
        _small()[0].replace(nheads=2, nheads_kv=2, causal=False), _small()[0].replace(nheads=2, nheads_kv=2),
        _small()[0].replace(head_dim=128, head_dim_v=128)])
    return check


def _kinds(cases):
    from fa4verify.checks.races import PdlOffCase, RaceCase
    return ([c for c in cases if isinstance(c, RaceCase)], [c for c in cases if isinstance(c, PdlOffCase)])


def test_the_default_audit_runs_a_short_race_run_and_full_adds_pdl_off(on_cpu):
    spec = on_cpu.production.__fa4verify_check__
    assert "default" in spec.profiles and spec.cases is not None and spec.summarise is not None
    on, off = _kinds(on_cpu._cases(_ctx("default")))
    assert len(on) == 6 and not off                              # 3 problems x 2 modes, PDL as FA4 ships it
    assert {c.reps for c in on} == {3} and {c.mode for c in on} == {"deterministic", "default"}
    on_f, off_f = _kinds(on_cpu._cases(_ctx("full")))
    assert len(on_f) == 8 and len(off_f) == 1 and off_f[0].reps == 8 and len(off_f[0].problems) == 4
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
    assert len(tasks) == 4 + 1                      # one per problem (its two modes share the key) + PDL off
    assert sorted(len(t.cases) for t in tasks) == [1, 2, 2, 2, 2]


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
    assert r.metrics["judged"] == r.metrics["reps"] == 3 * 2 * 2 and "PDL on" in r.summary
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
    monkeypatch.setattr(races, "RacingTarget", lambda busy=True, poison=True: _ORIGINAL_TARGET(
        adapter=adapter, device="cpu", busy=busy, poison=poison))
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
    monkeypatch.setattr(races, "run_races_pdl_off", lambda ps, reps, modes, timeout_s=None, poison=True: {
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


# ----------------------------------------------------------------------- Note [Poisoned scratch]
def test_the_buffer_rule_reads_uninitialised_allocations_only():
    """:func:`backward_buffers`: ``torch.empty``/``empty_like`` (or None) before the preprocess
    call and outside returning branches; zero/full-initialised buffers, later or early-exit
    assignments and mixed ones are not poisoned; the preprocess's parameters map by position and
    keyword."""
    from fa4verify.kernels.stage_taps import backward_buffers
    src = """
import torch
def _bwd_preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, *, fake_mode, extra=None):
    pass
def _flash_attn_bwd(q, k, v, out, dout, lse, dq=None, dk=None):
    if q.numel() == 0:
        dq = torch.zeros_like(q) if dq is None else dq.zero_()
        return dq
    if dq is None:
        dq = torch.empty_like(q)
    dk = torch.zeros_like(k) if dk is None else dk
    dpsum = torch.empty(3, dtype=torch.float32)
    lse_log2 = torch.full((3,), float("inf"))
    dq_accum = None if q.shape[0] else torch.empty(5)
    mixed = torch.empty(2)
    mixed = mixed + 1
    scratch = torch.empty(4)
    _bwd_preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, fake_mode=False, extra=scratch)
    late = torch.empty(9)
    return dq, dk
"""
    b = backward_buffers(src)
    assert b.uninitialised == {"dq", "dpsum", "dq_accum", "scratch"}, b.uninitialised
    assert b.at_preprocess() == ("dpsum", "dq_accum", "extra")
    assert b.preprocess["dout"] == "dout" and b.outputs == ("dq",) and b.unreachable() == ()
    assert backward_buffers(src.replace("    _bwd_preprocess(out", "    _other(out")).preprocess == {}
    assert backward_buffers("def f():\n    pass\n").uninitialised == frozenset()


@pytest.mark.fa4
def test_the_installed_backward_buffers_are_read_from_fa4s_source():
    """flash-attn-4 4.0.0b36's ``_flash_attn_bwd`` (interface.py): dq/dk/dv, dq_accum, dpsum and
    lse_log2 (and dsink) come from torch.empty; the GQA accumulators and the semaphores are zeroed
    by FA4 and are not poisoned."""
    import ast

    from fa4verify.kernels.fa4_params import fa4_source_dir
    from fa4verify.kernels.stage_taps import backward_buffers
    text = (fa4_source_dir() / "interface.py").read_text()
    b = backward_buffers(text)
    assert b.at_preprocess() == ("dpsum", "lse_log2", "dq_accum") and b.preprocess["dout"] == "dout"
    assert b.outputs == ("dq", "dk", "dv") and b.unreachable() == ("dsink",)
    zeroed = {"dk_accum", "dv_accum", "dQ_semaphore", "dK_semaphore", "dV_semaphore"}
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "_flash_attn_bwd")
    assigned = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert zeroed <= assigned and not (zeroed & b.uninitialised)


_POOLED = """

import torch as _torch

LOG2E = math.log2(math.e)
RACE = None          # "lse": the main kernel loads LSE before the preprocess wrote it; "dout": dO read early
COPY_DOUT = False    # FA4 copies dO before its preprocess
SKIP_PRE = False     # no preprocess at all
_RUNNING = []        # the preprocess launched, its writes not landed yet


class _Alloc:
    \"\"\"A caching allocator: the n-th request of a (shape, dtype) in a call gets the same block
    every call (what torch's allocator does for identical repetitions).\"\"\"
    def __init__(self):
        self.blocks, self.seen = {}, {}

    def begin(self):
        self.seen = {}

    def get(self, shape, dtype):
        key = (tuple(shape), dtype)
        i = self.seen.get(key, 0)
        self.seen[key] = i + 1
        lst = self.blocks.setdefault(key, [])
        if i == len(lst):
            lst.append(_torch.zeros(key[0], dtype=dtype))
        return lst[i]


_ALLOC = _Alloc()


class _CachingTorch:
    def __getattr__(self, name):
        return getattr(_torch, name)

    def empty(self, *shape, dtype=None, device=None):
        return _ALLOC.get(shape, dtype or _torch.float32)

    def empty_like(self, t):
        return _ALLOC.get(t.shape, t.dtype)


torch = _CachingTorch()


def _bwd_preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, *, fake_mode=False):
    d = (out.float() * dout.float()).sum(-1).permute(0, 2, 1)      # reads O and dO at its launch

    def land():
        dpsum.copy_(d)
        lse_log2.copy_(lse * LOG2E)
        dq_accum.zero_()
    _RUNNING.append(land)


_bwd_preprocess.compile_cache = {}


def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, softcap=0.0,
                    window_size_left=None, window_size_right=None, deterministic=False,
                    dq=None, dk=None, dv=None):
    _ALLOC.begin()
    compile_key = (q.dtype, q.shape[-1], causal, deterministic)
    if compile_key not in _flash_attn_bwd.compile_cache:
        _flash_attn_bwd.compile_cache[compile_key] = True
    if dq is None:
        dq = torch.empty_like(q)
    if dk is None:
        dk = torch.empty_like(k)
    if dv is None:
        dv = torch.empty_like(v)
    b, s, h, d = q.shape
    dq_accum = torch.empty(b, h, s * d, dtype=_torch.float32)
    dpsum = torch.empty(b, h, s, dtype=_torch.float32)
    lse_log2 = torch.empty(b, h, s, dtype=_torch.float32)
    if COPY_DOUT:
        dout = dout.clone()
    early = {}
    if RACE == "dout":
        early["dout"] = dout.clone()           # read before the kernel that produces it ran
    if not SKIP_PRE:
        _bwd_preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, fake_mode=False)
    if RACE == "lse":
        early["lse_log2"] = lse_log2.clone()   # the main kernel loads LSE while the preprocess still runs
    while _RUNNING:
        _RUNNING.pop(0)()
    seen = early.get("lse_log2", lse_log2)
    gq, gk, gv = _exact_bwd(q, k, v, out, early.get("dout", dout), lse, softmax_scale, causal, softcap,
                            window_size_left, window_size_right, deterministic=deterministic)
    off = _torch.exp2(lse.double() * LOG2E - seen.double())        # 1 where the LSE read was right
    dq_accum += (gq.double() * off.permute(0, 2, 1)[..., None]).permute(0, 2, 1, 3).reshape(b, h, s * d)
    dq.copy_(dq_accum.view(b, h, s, d).permute(0, 2, 1, 3))
    dk.copy_(gk.double() * off.mean())
    dv.copy_(gv.double() * off.mean())
    return dq, dk, dv


_flash_attn_bwd.compile_cache = {}
"""


@pytest.fixture()
def pooled_release(tmp_path, monkeypatch):
    """A fake FA4 with a preprocess, FA4's b36 allocation pattern and a caching allocator that hands
    every repetition the previous one's blocks; its flags plant a read before the producer wrote."""
    path = os.path.join(os.path.dirname(__file__), "fixtures", "fake_fa4_release.py")
    spec = importlib.util.spec_from_file_location("fake_fa4_release_fixture", path)
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    d = tmp_path / "flash_attn" / "cute"
    d.mkdir(parents=True)
    f = d / "interface_pooled.py"
    f.write_text(fixture.source(bwd_name="_exact_bwd") + _POOLED)
    spec = importlib.util.spec_from_file_location("fake_fa4_pooled", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(adapter, "fa4_interface", lambda: mod)
    monkeypatch.setattr(adapter, "_require_cuda", lambda: None)
    return mod


def _mha():
    return [_small()[0].replace(nheads=2, nheads_kv=2)]


def _race(poison: bool, reps: int = 3):
    t = races.RacingTarget(adapter=adapter, device="cpu", poison=poison)
    return t, races.run_races(t, _mha(), reps=reps, deterministic=True)[0]


def test_the_poisoned_harness_passes_a_correct_backward_and_poisons_every_scratch_buffer(pooled_release):
    from fa4verify.checks.races import result
    t, r = _race(True)
    assert r.judged == 3 and r.violations == 0 and r.bitwise_mismatches == 0 and r.poisoned == 3, r
    assert t.last_poison["complete"] and t.last_poison["poisoned"] == sorted(
        ["dout", "dpsum", "lse_log2", "dq_accum", "dq", "dk", "dv"])
    assert t.describe()["poison"]["at_preprocess"] == ["dpsum", "lse_log2", "dq_accum"]
    res = result({"deterministic, PDL on": [r]}, "CPU", {})
    assert res.status == "pass" and res.metrics["poisoned"] == 3 and "NaN-poisoned in 3/3" in res.summary


def test_a_read_before_the_preprocess_wrote_is_missed_on_reused_blocks_and_caught_when_poisoned(pooled_release):
    """The H200 miss reproduced on the CPU: identical repetitions get the previous one's blocks,
    so a load of the LSE before the preprocess wrote it reads the right values; with the poison it
    reads NaN and the judge fails it."""
    _race(False, reps=1)                       # a previous backward leaves the right values behind
    pooled_release.RACE = "lse"
    _, missed = _race(False)
    assert missed.judged == 3 and missed.violations == 0 and missed.poisoned == 0, missed
    _, caught = _race(True)
    assert caught.violations == 3 and "NaN in dq, dk, dv" in caught.first_failure, caught


def test_a_read_of_dout_before_its_producer_wrote_it_reads_nan(pooled_release):
    pooled_release.RACE = "dout"
    _, caught = _race(True, reps=2)
    assert caught.violations == 2 and "NaN in dq" in caught.first_failure, caught


@pytest.mark.parametrize("flag, why", [("COPY_DOUT", "copied it first"), ("SKIP_PRE", "called no preprocess")])
def test_the_harness_errs_when_it_cannot_produce_dout_right_before_the_preprocess(pooled_release, flag, why):
    """FA4 copying dO before its preprocess, or running none: fa4verify's error, never a verdict on
    FA4 (the dO it read was the NaN-poisoned staging buffer)."""
    from fa4verify.checks.races import result
    setattr(pooled_release, flag, True)
    _, r = _race(True, reps=2)
    assert r.errors == 2 and r.violations == 0 and why in r.first_failure, r
    assert result({"deterministic, PDL on": [r]}, "CPU", {}).status == "error"


def test_a_release_without_a_preprocess_runs_unpoisoned_and_says_so(fake_release):
    from fa4verify.checks.races import result
    t, r = _race(True, reps=2)
    assert r.judged == 2 and r.poisoned == 0 and not t.last_poison["complete"]
    assert "dout_producer" in t.describe() and "before FA4's backward" in t.describe()["dout_producer"]
    assert "NaN-poisoned in 0/2" in result({"m": [r]}, "CPU", {}).summary


def test_races_poison_off_reaches_the_target(on_cpu, pooled_release):
    from fa4verify.run.engine import run_here
    spec = on_cpu.production.__fa4verify_check__
    assert {c.poison for c in on_cpu._cases(_ctx("default"))} == {True}
    assert {c.poison for c in on_cpu._cases(_ctx("full", {"races_poison": "off"}))} == {False}
    with pytest.raises(ValueError, match="races_poison"):
        on_cpu._cases(_ctx("default", {"races_poison": "maybe"}))
    pooled_release.RACE = "lse"
    off = run_here(spec, _ctx("default", {"races_reps": "2", "races_poison": "off"}))
    assert off.metrics["poisoned"] == 0 and "NaN" not in off.summary, off.summary
    on = run_here(spec, _ctx("default", {"races_reps": "2"}))
    assert on.status == "fail" and on.metrics["poisoned"] == on.metrics["reps"] == 12, on.metrics
    assert "NaN in dq, dk, dv: a NaN-poisoned buffer was read before its producer wrote it" in on.summary, on.summary


# ----------------------------------------------------------------------- on the GPU (production FA4)
@pytest.mark.gpu
def test_production_backward_under_load_is_clean_with_every_scratch_buffer_poisoned():
    """Production FA4 raises no false alarm with its scratch NaN-poisoned (Note [Poisoned scratch]):
    dense causal, GQA, used-length Q with a sink, both modes, every repetition poisoned, within budget, bitwise equal."""
    t = races.RacingTarget()
    for det in (True, False):
        for r in races.run_races(t, races.race_problems(t.arch)[:3], reps=2, deterministic=det):
            assert r.judged == r.poisoned == 2 and not (r.violations or r.bitwise_mismatches or r.errors), r
    assert t.describe()["poison"]["at_preprocess"] == ["dpsum", "lse_log2", "dq_accum"]


@pytest.mark.gpu
def test_production_loads_of_lse_and_d_nobody_wrote_read_nan(monkeypatch):
    """A dropped wait at its worst, without timing: FA4's preprocess replaced by one that only zeroes
    dq_accum, so the main kernel loads LSE and D nobody wrote (after a clean repetition left the
    right values in the allocator's blocks). With the poison the gradients are NaN and fail."""
    from fa4verify.kernels.adapter import interface_module
    iface = interface_module()
    real = iface._bwd_preprocess

    def zero_dq_accum_only(out, dout, dpsum, lse, lse_log2, dq_accum, *args, **kw):
        if dq_accum is not None:
            dq_accum.zero_()
    zero_dq_accum_only.compile_cache = real.compile_cache
    t = races.RacingTarget()
    p = races.race_problems(t.arch)[0]
    clean, = races.run_races(t, [p], reps=1)
    assert clean.judged == clean.poisoned == 1, clean
    monkeypatch.setattr(iface, "_bwd_preprocess", zero_dq_accum_only)
    r, = races.run_races(t, [p], reps=2)
    assert r.violations == 2 and r.poisoned == 2 and "NaN in d" in r.first_failure, r


# ----------------------------------------------------------------------- Note [Early trigger]
_PRODUCER = r"""
from fa4verify.kernels import pdl_producer
print(pdl_producer.compile_only())
"""


@pytest.mark.fa4
def test_compile_only_the_producer_triggers_its_dependents_before_it_spins_and_writes(tmp_path):
    """Compile-only (sm_90a, no GPU): the dO producer's PTX executes griddepcontrol.launch_dependents
    first, then spins on clock64, and only then loads and stores (Note [Early trigger]); a compiler
    that dropped the spin or a trigger placed after the copy would let a dropped wait go unseen."""
    import subprocess
    import sys

    from fa4verify.compile.census import compile_env
    (tmp_path / "dump").mkdir()
    env = compile_env("sm_90a", tmp_path / "dump", tmp_path / "dsl-cache", keep="ptx")
    cp = subprocess.run([sys.executable, "-c", _PRODUCER], env=env, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    body = [ln.strip() for ln in cp.stdout.splitlines()]

    def first(token: str) -> int:
        return next(i for i, ln in enumerate(body) if token in ln)
    trigger, clock, store = first("griddepcontrol.launch_dependents"), first("%clock64"), first("st.global")
    assert trigger < clock < store, (trigger, clock, store)
    assert first("ld.global") > clock
    assert sum("%clock64" in ln for ln in body) >= 2          # read before and inside the spin loop


@pytest.mark.fa4
def test_the_early_trigger_producer_takes_only_what_it_can_copy():
    """The producer kernel copies contiguous 16-bit CUDA tensors of one size; the harness falls
    back to a torch copy for anything else (and the target says which produced dO)."""
    import torch

    from fa4verify.kernels import pdl_producer
    a = torch.zeros(8, dtype=torch.bfloat16)
    assert not pdl_producer.supported(a, a.clone())           # CPU tensors: no kernel
    with pytest.raises(ValueError, match="16-bit"):
        pdl_producer._words(torch.zeros(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="contiguous"):
        pdl_producer._words(torch.zeros(4, 4, dtype=torch.float16).t())


# The GPU proof of Note [Early trigger] is FA4's own: with this producer, races.production FAILs
# both planted dropped PDL waits on the H200 (scripts/planted_faults.py --kind race,
# docs/results/h200/planted/4fa734e/). A stand-alone CuTe consumer launched with use_pdl after it
# read the whole copy even without a wait there (0 NaN in two runs; why not found), so it proves
# nothing and was removed.


@pytest.mark.gpu
def test_production_race_target_produces_dout_with_the_early_trigger_kernel():
    t = races.RacingTarget()
    r, = races.run_races(t, races.race_problems(t.arch)[:1], reps=1)
    assert r.judged == r.poisoned == 1 and not r.violations, r
    assert t.last_producer == "early-trigger kernel"
    assert t.describe()["dout_producer"].startswith("early-trigger kernel")
