"""Note [Launch limits, compile-only]: a compile-only run names every FA4 call whose kernel needs
more shared memory per block than the arch allows (the launch CUDA rejects), read from the CuTe
DSL's host IR. Measured on the H200 at 6f502c4 (known issue sm90_bwd_hdv_gt_hd_smem): FA4's SM90
MHA backward at head dims 64/128 and 128/256 does not launch; 64/64 and 128/128 do."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fa4verify.compile import launch_limits

pytestmark = pytest.mark.fa4

#: the host IR of a launch over the limit, as the CuTe DSL 4.8.1 writes it (trimmed to its lines)
IR = """module {
  llvm.mlir.global internal constant @printfFormat_0("\\0AError: kernel '@kernels::@k_0' launch shared memory exceeds current GPU arch sm_90a allowed. Allocated: %lld bytes. Max: 232448 bytes.\\0A\\0A\\00") {addr_space = 0 : i32}
  llvm.func @host(%arg0: i64) {
    %21 = llvm.mlir.addressof @printfFormat_0 : !llvm.ptr
    %22 = llvm.mlir.constant(248832 : i64) : i64
    %751 = llvm.getelementptr %21[0, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.array<324 x i8>
    %752 = llvm.call @printf(%751, %22) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, i64) -> i32
    llvm.return
  }
}"""


def test_the_ir_reader_finds_the_over_limit_launch_and_only_it():
    assert launch_limits.over_limit(IR) == [("sm_90a", 248832, 232448)]
    # the format alone (emitted for every launch) is no finding: only its printf call is
    assert launch_limits.over_limit(IR.replace("llvm.call @printf(%751, %22)", "llvm.call @puts(%751)")) == []
    assert launch_limits.over_limit("module {}") == []


CODE = r"""
import json, sys
from fa4verify.compile import production as P
P.enter_fake_device("h200")
from fa4verify.problem import AttentionProblem, ValueSpec
out = {}
only = sys.argv[1:] or ["64/64/2", "64/128/2", "64/128/1", "64/128/2again"]
for name in only:
    hd, hdv, hk = (int(x) for x in name.replace("again", "").split("/"))
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=150, seqlen_k=150, nheads=2, nheads_kv=hk,
                         head_dim=hd, head_dim_v=hdv, values=ValueSpec("normal", 1))
    r = P._run_call(None, P.CompileCall("backward", p))
    out[name] = {k: r.get(k) for k in ("launch_over_limit", "kernels_read", "kernels_unread", "refused", "call")}
print("JSON" + json.dumps(out))
"""


def _run(tmp_path, *args, cache=None):
    import os
    env = dict(os.environ, FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="0")
    if cache is not None:
        env.update(FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1", FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=900, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("JSON", 1)[1])


@pytest.mark.slow
def test_a_compile_only_call_reports_the_sm90_backward_that_would_not_launch(tmp_path):
    out = _run(tmp_path)
    assert out["64/64/2"]["launch_over_limit"] == [] and out["64/64/2"]["kernels_read"] >= 2
    # a call that reuses the kernel compiled by an earlier call of the process is named too
    assert out["64/128/2again"]["launch_over_limit"] == out["64/128/2"]["launch_over_limit"]
    over = out["64/128/2"]["launch_over_limit"]
    assert [(a, n, m) for _name, a, n, m in over] == [("sm_90a", 248832, 232448)], over
    assert "Backward" in over[0][0] or "bwd" in over[0][0]
    assert out["64/128/1"]["launch_over_limit"] == [] and "forward only" in out["64/128/1"]["call"]   # GQA: FA4 asserts
    # the check's summary: the measured FA4 defect is the known issue's, anything else a fail
    from fa4verify.compile.production import CompileCall, _launch_verdicts
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=150, seqlen_k=150, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=128)
    res = {"call": out["64/128/2"]["call"], "launch_over_limit": over}
    unexplained, known = _launch_verdicts([(CompileCall("backward", p), res)])
    assert unexplained == [] and list(known.values()) == ["sm90_bwd_hdv_gt_hd_smem"]
    q = p.replace(head_dim=192, head_dim_v=128)        # a launch failure no known issue describes
    unexplained, known = _launch_verdicts([(CompileCall("backward", q), res)])
    assert len(unexplained) == 1 and not known and "248,832 B" in unexplained[0]


@pytest.mark.slow
def test_a_kernel_loaded_from_the_kernel_cache_keeps_its_launch_verdict(tmp_path):
    """With FA4's persistent kernel cache the verdict is stored beside the cached kernel: a later
    process that loads it from disk names the same launch; a cache without the record is not read."""
    cache = tmp_path / "kcache"
    first = _run(tmp_path, "64/128/2", cache=cache)["64/128/2"]
    second = _run(tmp_path, "64/128/2", cache=cache)["64/128/2"]
    assert first["launch_over_limit"] and second["launch_over_limit"] == first["launch_over_limit"]
    assert second["kernels_unread"] == 0
    for f in cache.rglob("*.launch.json"):
        f.unlink()
    third = _run(tmp_path, "64/128/2", cache=cache)["64/128/2"]
    assert third["launch_over_limit"] == [] and third["kernels_unread"] >= 1


def test_a_key_that_never_reached_the_cache_is_no_kernel_use(monkeypatch):
    """``take``: a key FA4 asked for whose compile raised (FA4 refused the call while tracing) is
    neither read nor unread; one loaded from disk without its record is unread; a recorded one read."""
    monkeypatch.setattr(launch_limits, "_BY_KEY", {"rec": [], "over": [["f", "sm_100a", 9, 8]], "disk": None})
    monkeypatch.setattr(launch_limits, "_USED", {"rec", "over", "disk", "refused"})
    over, read, unread = launch_limits.take()
    assert (read, unread) == (2, 1) and over == [("f", "sm_100a", 9, 8)]
