"""``fa4verify audit --fake-device b200`` on this CPU box (Note [Fake device audit]): the default
audit of a B200 runs its CPU checks as usual, and every check that would run FA4 on the B200
either compiles the FA4 calls it declares -- the kernel cache on, the SM100 forward with exp2
emulation on and off -- and reports "compile-only" (a skip: nothing was measured), or says why it
cannot; no check ends in ``error`` and nothing is labelled "measured on".

Measured here (2-core CPU box, FA4 4.0.0b36, DSL 4.8.1; compile-only): the default audit, one
subprocess, about 60 s idle with a cold kernel cache (budgets.production.backward ~30 s,
production.head_dims_live ~18 s, budgets.production.forward ~10 s); the fixture audit ~15 s.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.fa4]

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "audit_checks_fake_device.py")
#: the checks that run FA4 on a B200 in the default profile and compile their calls here
COMPILED = ("budgets.production.forward", "budgets.production.backward", "production.forward_rule",
            "production.head_dims_live", "determinism.fa4", "races.production", "production.combine")
#: the two with one compile per FA4 compile key of a plan of 50-71 cases (minutes here): the
#: extended test runs them
LONG = ("coverage.production", "fuzz.production")


def _audit(tmp, *args, name="r.json"):
    """The audit in a process of its own (the fake device is process state), run in ``tmp``."""
    out = tmp / name
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FA4VERIFY_FAKE", "CUTE_DSL_", "FLASH_ATTENTION_"))}
    env["COLUMNS"] = "300"                   # the banner on one line
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--fake-device", "b200",
                        "--no-live", "--json", str(out), *args],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=7200)
    dt = time.monotonic() - t0
    rep = json.loads(out.read_text()) if out.exists() else None
    return r, rep, dt


@pytest.fixture(scope="module")
def b200(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fakeb200")
    kc = tmp / "kc"
    r, rep, dt = _audit(tmp, "--kernel-cache", str(kc), "--workers", "2",
                        "-k", " and ".join(f"not {c}" for c in LONG))
    print(f"\nfake-device b200 default audit: exit {r.returncode} in {dt:.1f} s")
    assert rep is not None, r.stdout[-3000:] + r.stderr[-3000:]
    return r, rep, kc


@pytest.mark.slow
def test_the_fake_b200_audit_has_no_error_and_measures_nothing(b200):
    _check_audit(*b200[:2], COMPILED)
    cmb = next(x for x in b200[1]["results"] if x["id"] == "production.combine")
    calls = [row[0] for row in cmb["details"]["table"]["rows"]]
    # two split counts, each batched, packed with cu_seqlens (Note [The varlen combine]) and with
    # seqused / virtual_batch_idx / both on packed rows (Note [Used rows and virtual batches]), and
    # the synthetic partials of Note [Combine shapes] at the head dims SM100 returns
    from fa4verify.checks.combine import SPLITS, shapes_for
    assert sum(c.startswith("combine ") for c in calls) == 5 * len(SPLITS) + len(shapes_for("sm100")) == 13, calls
    assert sum("+seqused" in c for c in calls) == 2 * len(SPLITS) and sum("+virtual_batch_idx" in c for c in calls) == 4
    assert any(c.startswith("forward ") for c in calls), calls
    assert sum("cu_seqlens" in c for c in calls) == 2, calls
    assert all(c[-1]["compile_key"] for c in cmb["details"]["configs"]), cmb["details"]["configs"]


def _check_audit(r, rep, compiled):
    res = {x["id"]: x for x in rep["results"]}
    assert not [i for i, x in res.items() if x["status"] == "error"], \
        {i: x["summary"] for i, x in res.items() if x["status"] == "error"}
    assert r.returncode == 0, r.stdout[-3000:]
    assert rep["config"]["fake_device"] == "b200" and rep["config"]["archs"] == ["sm100"]
    assert not [i for i, x in res.items() if x["where"].startswith("measured")]
    cuda = [x for x in rep["results"] if "cuda" in x["needs"]]
    assert {x["id"] for x in cuda} >= set(compiled) | {"sequences.production"}
    for x in cuda:
        assert x["status"] == "skip", (x["id"], x["status"], x["summary"])
        assert x["summary"].startswith("compile-only on a fake NVIDIA B200 (sm_100): "), x
        if x["id"] == "sequences.production":
            assert "no list of FA4 calls to compile" in x["summary"], x
        if x["id"] in compiled:
            assert x["where"] == "compile-only" and x["metrics"]["compiled_calls"] >= 1, x
    assert any(x["status"] == "pass" for x in rep["results"])      # the CPU checks ran


@pytest.mark.slow
def test_the_sm100_forward_compiled_with_emulation_on_and_off_into_the_kernel_cache(b200):
    _r, rep, kc = b200
    fwd = next(x for x in rep["results"] if x["id"] == "budgets.production.forward")
    cfgs = [c for call in fwd["details"]["configs"] for c in call]
    on = [c for c in cfgs if "disabled" not in str(c["exp2_emulation"])]
    off = [c for c in cfgs if "disabled" in str(c["exp2_emulation"])]
    assert len(on) == len(off) == fwd["metrics"]["compiled_calls"] // 2 >= 4
    assert all(c["arch"] == 100 and c["compile_key"]["arch"] == 100 for c in cfgs)
    assert all(c["emulated_share"] > 0 for c in on) and all(c["emulated_share"] == 0.0 for c in off)
    # the objects on disk, each with its integrity manifest (Note [Kernel cache integrity])
    objs = sorted(kc.rglob("*.o"))
    by = {}
    for o in objs:
        rel = o.relative_to(kc).parts
        assert rel[0] == "sm100a", rel
        by.setdefault(o.parent.name, []).append(o)
        man = o.parent / (o.name + ".sha256")
        assert man.read_text().strip() == hashlib.sha256(o.read_bytes()).hexdigest(), o
    assert len(by.get("fwd", [])) >= 4 and len(by.get("fwd-ex2emu-off", [])) >= 4, sorted(by)


@pytest.mark.slow(extended="the complete default audit of a fake B200, coverage.production and "
                           "fuzz.production included (over 25 minutes on 2 cores: ~1,000 sm_100a compiles)")
def test_the_complete_fake_b200_audit_has_no_error(tmp_path):
    r, rep, dt = _audit(tmp_path, "--kernel-cache", str(tmp_path / "kc"), "--workers", "2")
    print(f"\ncomplete fake-device b200 default audit: exit {r.returncode} in {dt:.1f} s")
    assert rep is not None, r.stdout[-3000:] + r.stderr[-3000:]
    _check_audit(r, rep, COMPILED + LONG)


@pytest.mark.slow
def test_a_broken_plan_is_an_error_a_missing_one_a_skip_and_cpu_checks_run(tmp_path):
    """The same audit path with fixture checks: a compile plan that raises is ``error`` (exit 3:
    the "no error" assertion above can fail), a "cuda" check without a plan skips saying why, a
    declared call compiles (emulation off, compile-only), no cuda check's own code runs."""
    r, rep, dt = _audit(tmp_path, "--no-default-checks", "--checks-module", FIX, "--kernel-cache", "off")
    assert rep is not None, r.stdout[-3000:] + r.stderr[-3000:]
    res = {x["id"]: x for x in rep["results"]}
    assert r.returncode == 3
    assert res["fixture.fake.broken_plan"]["status"] == "error"
    assert "planted: the compile plan broke" in res["fixture.fake.broken_plan"]["summary"]
    assert res["fixture.fake.no_plan"]["status"] == "skip"
    assert "declares no FA4 calls to compile" in res["fixture.fake.no_plan"]["summary"]
    one = res["fixture.fake.one_call"]
    assert (one["status"], one["where"], one["metrics"]["compiled_calls"]) == ("skip", "compile-only", 1), one
    assert "1 with exp2 emulation off" in one["summary"]
    assert res["fixture.fake.cpu"]["status"] == "pass"
    assert "a fake NVIDIA B200 (sm_100) (CPU checks + compile-only)" in r.stdout
    print(f"\nfixture fake-device audit: {dt:.1f} s")


@pytest.mark.parametrize("args,words", [(["--fake-device", "a100"], "--fake-device 'a100': choose from b200"),
                                        (["--fake-device", "b200", "--device", "cpu"], "excludes --device cpu")])
def test_a_bad_fake_device_is_one_line_and_exit_2(tmp_path, args, words):
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--no-live", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_fake_device_is_the_local_gpu_and_labels_compile_only(monkeypatch):
    from fa4verify.audit.registry import CheckContext, cuda_available
    from fa4verify.kernels import device
    monkeypatch.setenv(device.FAKE_DEVICE_ENV, "b200")
    device.local_gpu.cache_clear()
    try:
        g = device.local_gpu()
        assert (g.name, g.arch, g.fake) == ("NVIDIA B200", "sm100", True)
        assert device.where_measured(g) == "compile-only" and cuda_available()
        assert CheckContext(device="cuda").where_measured() == "compile-only"
        monkeypatch.setenv(device.FAKE_DEVICE_ENV, "a100")
        device.local_gpu.cache_clear()
        with pytest.raises(ValueError, match="expected one of b200, b300, h200"):
            device.local_gpu()
    finally:
        monkeypatch.delenv(device.FAKE_DEVICE_ENV)
        device.local_gpu.cache_clear()
    assert device.where_measured(device.GPU("NVIDIA B200", 10, 0)) == "measured on NVIDIA B200 (sm_100)"


_DLSE_CALL = """
import json
from fa4verify.compile.production import CompileCall, _run_call, enter_fake_device
from fa4verify.problem import AttentionProblem, ValueSpec
enter_fake_device("b200")
p = AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=90, nheads=2, nheads_kv=2,
                     head_dim=64, head_dim_v=64, causal=True, values=ValueSpec("normal", 0))
pv = p.replace(batch=2, seqlens_q=(70, 33), seqlens_k=(90, 41))      # the dLSE pass runs on varlen calls too
print(json.dumps([_run_call(None, CompileCall("backward", x, dlse=d)) for x in (p, pv) for d in (False, True)]))
"""


@pytest.mark.slow
def test_a_campaign_backward_also_compiles_its_dlse_variant():
    """Note [A gradient through the LSE]: where the bwd_stages dLSE pass would run on a B200, the
    compile-only audit compiles that backward too (its preprocess takes dLSE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FA4VERIFY_FAKE", "CUTE_DSL_", "FLASH_ATTENTION_"))}
    r = subprocess.run([sys.executable, "-c", _DLSE_CALL], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = json.loads(r.stdout.strip().splitlines()[-1])
    for plain, with_dlse in (runs[:2], runs[2:]):
        assert [c["op"] for c in plain["configs"]] == ["forward", "backward"], plain
        assert [c["op"] for c in with_dlse["configs"]] == ["forward", "backward", "backward"], with_dlse
        assert with_dlse["configs"][-1]["return_lse"] and not with_dlse["configs"][1]["return_lse"]
        assert all(c["arch"] == 100 for c in with_dlse["configs"])


def test_the_deterministic_block_sparse_lists_build_under_fake_tensors():
    """A compile-only (fake-device) deterministic block-sparse backward: FA4's dQ write order is
    computed on real CPU lists and handed over as device tensors (a CPU torch refuses FA4's scatter
    into a fake CUDA tensor: 'PyTorch is not linked with support for cuda devices'); on the fake
    B200 audit this errored coverage.production's deterministic block-sparse rows. The values are
    FA4's own order, the same as outside the fake mode."""
    import numpy as np
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from fa4verify.kernels import adapter
    mask = np.random.default_rng(3).random((2, 2, 1)) < 0.7
    kw = dict(batch=2, nheads=4, block_size=(128, 128), direction="bwd", deterministic=True)
    real = adapter.block_sparse_tensors(mask, device="cpu", **kw)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = adapter.block_sparse_tensors(mask, device="cuda", **kw)
    assert fake.dq_write_order.device.type == "cuda"
    assert tuple(fake.dq_write_order.shape) == tuple(real.dq_write_order.shape)
    assert tuple(fake.dq_write_order_full.shape) == tuple(real.dq_write_order_full.shape)
