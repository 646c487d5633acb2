"""dQ-path floating-point atomics and the deterministic-mode semaphore (fa4verify.compile.census_atomics).

The default run checks the parser and the verdict on synthetic PTX/SASS and on the instruction
lines recorded from real compiles (tests/fixtures/bwd_atomics: the categorised lines of FA4
4.0.0b36's main backward kernel, hd128 non-causal bf16, sm_100a and sm_90a, deterministic and
default; compile-only). FA4VERIFY_SLOW=1 compiles sm_100a backward both ways (~60 s) and checks
the same shape on fresh PTX/SASS, and that it equals the recorded fixture.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fa4verify.compile import census as C, census_atomics as A

FIX = Path(__file__).parent / "fixtures" / "bwd_atomics"
MAIN = {"sm_100a": "cutlass___call___flash_attncuteflash_bwd_sm100FlashAttentionBackwardSm100_object_at__x",
        "sm_90a": "cutlass___call___flash_attncuteflash_bwd_sm90FlashAttentionBackwardSm90_object_at__x"}


def _recorded(arch: str, det: bool, drop: str = "") -> dict:
    label = f"{arch}-hd128-noncausal-bwd" + ("-det" if det else "")
    ptx = (FIX / f"{label}.ptx.txt").read_text()
    sass = (FIX / f"{label}.sass.txt").read_text()
    if drop:
        ptx = "\n".join(ln for ln in ptx.splitlines() if drop not in ln)
    res = C.CaseResult(C.CensusCase(arch, 128, backward=True, deterministic=det), 0.0, {},
                       {"arch": 100 if arch == "sm_100a" else 90, "deterministic": det},
                       [C.KernelArtifacts(MAIN[arch], ptx, sass)])
    return A.atomics_census(res)


def test_ptx_categories():
    ptx = """
    // red.global.add.f32 [%rd1], %f1;   (a comment: not counted)
    red.global.add.f32 [%rd1], %f1;
    @%p1 atom.global.add.f32 %f2, [%rd1], %f1;
    red.global.v4.f32.add [%rd1], {%f1, %f2, %f3, %f4};
    red.relaxed.gpu.global.add.noftz.bf16x2 [%rd1], %r1;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1], 8192;
    cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%rd1, {%r1, %r2}], [%r3];
    ld.global.acquire.gpu.b32 %r1, [%rd2];
    red.release.gpu.global.add.s32 [%rd2], 1;
    atom.global.cas.b32 %r1, [%rd2], 0, 1;
    membar.gl;
    fence.acq_rel.gpu;
    fence.proxy.async.shared::cta;
    cp.async.bulk.wait_group 0;
    cp.async.bulk.wait_group.read 1;
    add.f32 %f1, %f2, %f3;
    """
    c = A.atomics_ptx(ptx)["counts"]
    assert c[A.PTX_KEYS[2]] == 4            # scalar, atom, vectorised, bf16x2
    assert c[A.PTX_KEYS[0]] == 1 and c[A.PTX_KEYS[1]] == 1
    assert c[A.PTX_KEYS[6]] == 1 and c[A.PTX_KEYS[3]] == 1 and c[A.PTX_KEYS[4]] == 1
    assert c[A.PTX_KEYS[5]] == 1 and c[A.PTX_KEYS[7]] == 2
    assert c[A.PTX_KEYS[8]] == 1 and c[A.PTX_KEYS[9]] == 1


def test_sass_categories():
    sass = """
        /*0010*/                   UBLKRED.G.S.ADD.F32.RN [UR4], [UR25], UR6 ;
        /*0020*/               @P2 REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR12][R40.64], R38 ;
        /*0030*/                   RED.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR12][R40.64], R4 ;
        /*0040*/               @P2 REDG.E.ADD.S32.STRONG.GPU desc[UR12][R40.64], R38 ;
        /*0050*/                   LDG.E.STRONG.GPU R3, desc[UR12][R38.64] ;
        /*0060*/                   LDG.E.128 R4, desc[UR12][R38.64] ;
        /*0070*/                   MEMBAR.ALL.GPU ;
        /*0080*/                   MEMBAR.ALL.CTA ;
        /*0090*/                   ATOMG.E.CAS.STRONG.GPU PT, R2, [R4], R6, R7 ;
        /*00a0*/                   ATOMS.OR RZ, [R8], R13 ;
    """
    c = A.atomics_sass(sass)["counts"]
    assert c[A.SASS_KEYS[0]] == 1 and c[A.SASS_KEYS[2]] == 2 and c[A.SASS_KEYS[3]] == 1
    assert c[A.SASS_KEYS[5]] == 1 and c[A.SASS_KEYS[6]] == 1 and c[A.SASS_KEYS[4]] == 1


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_recorded_deterministic_orders_dq_atomics_default_does_not(arch):
    det, dft = _recorded(arch, True), _recorded(arch, False)
    v = A.dq_verdict(det, dft)
    assert v.status == "pass" and v.mode == "semaphore-ordered fp atomics", v.summary
    kd = det["kernels"][next(iter(det["kernels"]))]
    kf = dft["kernels"][next(iter(dft["kernels"]))]
    pd, pf = kd["ptx"]["counts"], kf["ptx"]["counts"]
    sd, sf = kd["sass"]["counts"], kf["sass"]["counts"]
    # both modes accumulate dQ with fp32 bulk reduce-add (the atomics stay in deterministic mode)
    assert pd[A.PTX_KEYS[0]] > 0 and pf[A.PTX_KEYS[0]] > 0
    assert sd[A.SASS_KEYS[0]] == pd[A.PTX_KEYS[0]] and sf[A.SASS_KEYS[0]] == pf[A.PTX_KEYS[0]]
    # deterministic: acquire spin + release increment + waits for the writes; default: none
    assert pd[A.PTX_KEYS[6]] >= 1 and pd[A.PTX_KEYS[4]] >= 1 and pd[A.PTX_KEYS[8]] >= 1
    assert sd[A.SASS_KEYS[5]] >= 1 and sd[A.SASS_KEYS[3]] >= 1 and sd[A.SASS_KEYS[6]] >= 1
    assert pf[A.PTX_KEYS[6]] == 0 and pf[A.PTX_KEYS[4]] == 0 and pf[A.PTX_KEYS[8]] == 0
    assert sf[A.SASS_KEYS[5]] == 0 and sf[A.SASS_KEYS[3]] == 0
    # no scalar fp red/atom anywhere: the dQ atomics are the bulk reductions only
    assert pd[A.PTX_KEYS[2]] == 0 and pf[A.PTX_KEYS[2]] == 0
    assert "unordered" in v.summary


@pytest.mark.parametrize("drop", ["ld.global.acquire", "red.release"])
def test_verdict_fails_without_the_semaphore(drop):
    """The check can fail: the deterministic kernel with its acquire spin (or release) removed
    has unordered fp atomics."""
    v = A.dq_verdict(_recorded("sm_100a", True, drop=drop), _recorded("sm_100a", False))
    assert v.status == "fail" and v.mode == "unordered fp atomics", v.summary


def test_verdict_passes_without_fp_atomics():
    det = _recorded("sm_100a", True, drop="cp.reduce.async.bulk")
    v = A.dq_verdict(det, _recorded("sm_100a", False))
    assert v.status == "pass" and v.mode == "no fp atomics"


@pytest.mark.fa4
@pytest.mark.slow(extended="the sm_100a backward compiles (~60 s)")
def test_sm100_compiled_backward_atomics_shape(tmp_path):
    det, dft, _ = A.compile_bwd_pair("sm_100a", 128, False, tmp_path)
    v = A.dq_verdict(det, dft)
    assert v.status == "pass" and v.mode == "semaphore-ordered fp atomics", v.summary
    for fresh, recorded in ((det, _recorded("sm_100a", True)), (dft, _recorded("sm_100a", False))):
        main = next(k for k in fresh["kernels"].values() if k["role"] == "bwd main")
        rec = next(iter(recorded["kernels"].values()))
        assert main["ptx"]["counts"] == rec["ptx"]["counts"]
        assert main["sass"]["counts"] == rec["sass"]["counts"]
        others = [k for k in fresh["kernels"].values() if k["role"] in ("bwd preprocess", "bwd postprocess")]
        assert others and all(k["ptx"]["counts"][A.PTX_KEYS[0]] == 0 for k in others)
    assert det["compile_key"]["deterministic"] is True and dft["compile_key"]["deterministic"] is False


def test_sass_cli_has_atomics_and_deterministic_switch(capsys):
    from click.testing import CliRunner

    from fa4verify.cli.sass import _print_atomics, command
    out = CliRunner().invoke(command, ["--help"]).output
    assert "--atomics" in out and "--no-deterministic" in out
    _print_atomics(_recorded("sm_100a", True))
    text = capsys.readouterr().out
    assert "compile-only" in text and "ld.global.acquire.gpu.b32" in text and "UBLKRED.G.S.ADD.F32.RN" in text
