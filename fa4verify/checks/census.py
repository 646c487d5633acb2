"""Audit checks from the compile-only instruction census (``fa4verify.compile.census``), no GPU.

* ``census.emulated_columns`` -- compile FA4's SM100 forward (sm_100a, hd128, causal and
  non-causal; ``full`` adds hd64 and hd192) and read, from the PTX in program order, which of the
  128 columns of each unrolled softmax tile use the polynomial (``add.rm.f32x2`` floors) instead
  of MUFU ``ex2.approx``; they must equal ``twin.emulated_columns`` for the configuration FA4
  chose (2-CTA, tuning key taken from FA4's own compile key).
* ``census.sm90_exponent_argument`` -- compile FA4's SM90 forward and check that the PTX writes
  ``S*c - m*c`` as un-suffixed ``mul.f32`` + ``sub.f32`` and the SASS has one FFMA with a
  negated addend per tile exp2 (ptxas contraction): the CPU twin must model a fused FMA there.
* ``census.probes`` -- the probe kernels compile for sm_90a/sm_100a to the instructions of the
  FA4 stage they isolate (degree-3 Horner = 3 FFMA after an FADD.FTZ.RM, packed variant =
  FFMA2/FADD2.RM, MUFU ops, RNE F2FP conversions).

* ``census.bwd_atomics`` -- compile FA4's backward (sm_100a and sm_90a, deterministic and
  default) and count the dQ path's fp32 atomics and the semaphore that orders them
  (:mod:`fa4verify.compile.census_atomics`); the static side of the B200 determinism claim.

* ``census.pdl_waits`` -- compile FA4's backward (sm_90a, sm_100a) and check that every kernel
  FA4 launches with programmatic dependent launch executes ``griddepcontrol.wait``
  (:mod:`fa4verify.compile.census_pdl`); default profile (two compiles).

Each FA4 compile takes 5-15 s on 2 cores, so the others run in the ``full`` and ``exhaustive``
profiles only. Every figure is "compile-only".
"""
from __future__ import annotations

import re
import tempfile

from fa4verify.audit.registry import CheckContext, CheckResult, check


def _census(case, workdir):
    from fa4verify.compile import census as C
    return C.census_case(C.compile_case(case, workdir))


@check("census.emulated_columns", title="SM100 exp2 emulated columns in the compiled PTX == twin rule",
       needs={"cpu", "fa4"}, profiles={"full", "exhaustive"})
def emulated_columns(ctx: CheckContext) -> CheckResult:
    from fa4verify.compile.census import CensusCase
    cases = [CensusCase("sm_100a", 128, causal=False), CensusCase("sm_100a", 128, causal=True)]
    if ctx.profile_level >= 3:
        cases += [CensusCase("sm_100a", 64, causal=False), CensusCase("sm_100a", 192, causal=False, head_dim_v=128),
                  CensusCase("sm_100a", 192, causal=True, head_dim_v=128)]
    rows, metrics, bad = [], {}, []
    with tempfile.TemporaryDirectory(prefix="fa4census-") as wd, \
            ctx.progress(len(cases), "compiling FA4 for sm_100a") as bar:
        for c in cases:
            cen = _census(c, wd)
            d = cen["emulation_from_ptx"]
            fc = cen["forward_config"]
            match = cen.get("ptx_matches_twin")
            rows.append([cen["label"], str(fc.get("tuning_key")), d["tile_copies"],
                         f"{d['share']:.4f}", f"{fc.get('emulated_share')}", str(match)])
            tag = cen["label"].replace("sm_100a-", "").replace("-", "_")
            metrics[f"emulated_share_{tag}"] = d["share"]
            if match is not True:
                bad.append(f"{cen['label']}: PTX columns {d['emulated_columns']} vs twin "
                           f"{cen.get('twin_emulated_columns')}")
            bar.advance(1)
    return CheckResult(
        status="fail" if bad else "pass", where="compile-only",
        summary="; ".join(bad) if bad else
        f"emulated columns read from the PTX equal the twin's rule in all {len(cases)} configurations",
        metrics=metrics,
        details={"table": {"columns": ["case", "tuning key", "tile copies", "share (PTX)", "share (twin)", "match"],
                           "rows": rows}})


@check("census.sm90_exponent_argument", title="SM90 S*c - m*c is contracted to one FFMA by ptxas",
       needs={"cpu", "fa4"}, profiles={"full", "exhaustive"})
def sm90_exponent_argument(ctx: CheckContext) -> CheckResult:
    from fa4verify.compile.census import CensusCase
    with tempfile.TemporaryDirectory(prefix="fa4census-") as wd:
        cen = _census(CensusCase("sm_90a", 128, causal=True), wd)
    k = cen["kernels"][cen["forward_kernel"]]
    ptx, sass = k["ptx"], k["sass"] or {}
    subs, ffma_neg = ptx["sub.f32 (contractible)"], sass.get("FFMA with negated addend", 0)
    emu = ptx["add.rm.f32x2 (emulation floor, pair)"] + ptx["add.rm.ftz.f32 (emulation floor)"]
    ok = subs > 0 and ffma_neg >= subs - 8 and emu == 0 and sass.get("MUFU.EX2", 0) == ptx["ex2.approx.ftz.f32"]
    return CheckResult(
        status="pass" if ok else "fail", where="compile-only",
        summary=(f"{ffma_neg} FFMA with negated addend for {subs} PTX sub.f32; no emulation; "
                 f"{sass.get('MUFU.EX2', 0)} MUFU.EX2"),
        metrics={"ptx_sub_f32": subs, "sass_ffma_negated_addend": ffma_neg, "emulation_floors": emu,
                 "mufu_ex2": sass.get("MUFU.EX2", 0)},
        details={"ptx": ptx, "sass": sass})


@check("census.probes", title="Probe kernels compile to the instructions of the FA4 stage they isolate",
       needs={"cpu", "fa4"}, profiles={"full", "exhaustive"})
def probes(ctx: CheckContext) -> CheckResult:
    from fa4verify.kernels.probes import probe_base as pb

    def ops(sass):
        return [ln.split(";")[0].split("*/")[-1].strip() for ln in sass.splitlines()
                if re.search(r"\b(MUFU|FFMA2?|FADD2?|F2FP)\b", ln)]

    expect = {
        ("sm_90a", "ex2_emulation", "3"): lambda o: sum(x.startswith("FFMA ") for x in o) == 3
        and any(x.startswith("FADD.FTZ.RM") for x in o),
        ("sm_90a", "mufu_ex2", "fastmath"): lambda o: [x.split()[0] for x in o if x.startswith("MUFU")] == ["MUFU.EX2"],
        ("sm_90a", "mufu_tanh", "fastmath"): lambda o: [x.split()[0] for x in o if x.startswith("MUFU")] == ["MUFU.TANH"],
        ("sm_100a", "mufu_tanh", "fastmath"): lambda o: [x.split()[0] for x in o if x.startswith("MUFU")] == ["MUFU.TANH"],
        ("sm_90a", "rcp", "approx"): lambda o: [x.split()[0] for x in o if x.startswith("MUFU")] == ["MUFU.RCP"],
        ("sm_90a", "log2", "fastmath"): lambda o: [x.split()[0] for x in o if x.startswith("MUFU")] == ["MUFU.LG2"],
        ("sm_90a", "exparg", "sm90"): lambda o: any(re.search(r"FFMA .*,\s*-R\w+$", x) for x in o),
        ("sm_90a", "cvt", "cvt_bf16x2"): lambda o: any(x.startswith("F2FP.BF16") for x in o),
        ("sm_100a", "ex2_emulation_2", "3"): lambda o: sum(x.startswith("FFMA2") for x in o) == 3
        and sum(x.startswith("FADD2.RM") for x in o) == 1,
        ("sm_100a", "fma_packed", "rn"): lambda o: [x.split()[0] for x in o] == ["FFMA2"],
    }
    rows, bad = [], []
    with tempfile.TemporaryDirectory(prefix="fa4probes-") as wd:
        for arch in ("sm_90a", "sm_100a"):
            items = [(p, v) for (a, p, v) in expect if a == arch]
            for art in pb.compile_many_in_subprocess(items, arch, wd):
                o = ops(art.sass)
                ok = expect[(arch, art.probe, art.variant)](o)
                rows.append([arch, f"{art.probe}[{art.variant}]", " | ".join(o)[:120], str(ok)])
                if not ok:
                    bad.append(f"{arch} {art.probe}[{art.variant}]: {o}")
    return CheckResult(status="fail" if bad else "pass", where="compile-only",
                       summary="; ".join(bad) if bad else f"{len(rows)} probe compiles have the expected SASS",
                       metrics={"probe_compiles": len(rows), "unexpected": len(bad)},
                       details={"table": {"columns": ["arch", "probe", "SASS", "ok"], "rows": rows}})


@check("census.bwd_atomics", title="Deterministic backward orders its dQ fp32 atomics (semaphore); default does not",
       needs={"cpu", "fa4"}, profiles={"full", "exhaustive"})
def bwd_atomics(ctx: CheckContext) -> CheckResult:
    """Compile FA4's backward for sm_100a (and sm_90a) with ``deterministic=True`` and with the
    default; count the dQ path's floating-point atomics (TMA bulk ``cp.reduce.async.bulk ...
    add.f32`` / SASS ``UBLKRED.G.S.ADD.F32.RN``, plus any ``red``/``atom`` ``.add.f32``) and the
    semaphore ops (``ld.global.acquire.gpu`` spin, ``red.release.gpu.global.add.s32``, bulk waits
    for the writes). Pass when the deterministic dQ path has no fp atomics or orders them with the
    semaphore; the default mode's unordered atomics are reported. Evidence: compile-only."""
    from fa4verify.compile import census_atomics as A
    archs = ["sm_100a", "sm_90a"]
    rows, metrics, bad, summaries = [], {}, [], []
    with tempfile.TemporaryDirectory(prefix="fa4atomics-") as wd, \
            ctx.progress(2 * len(archs), "compiling FA4 backward (deterministic / default)") as bar:
        for arch in archs:
            det, dft, secs = A.compile_bwd_pair(arch, 128, False, wd)
            bar.advance(2)
            v = A.dq_verdict(det, dft)
            rows += v.rows
            tag = arch.replace("_", "")
            for cen, mode in ((det, "det"), (dft, "default")):
                for name, k in cen["kernels"].items():
                    if k["role"] == "bwd main":
                        p = k["ptx"]["counts"]
                        metrics[f"{tag}_{mode}_dq_fp_atomic_sites"] = p[A.PTX_KEYS[0]] + p[A.PTX_KEYS[1]] + p[A.PTX_KEYS[2]]
                        metrics[f"{tag}_{mode}_acquire_loads"] = p[A.PTX_KEYS[6]]
                        metrics[f"{tag}_{mode}_release_reds"] = p[A.PTX_KEYS[4]]
            metrics[f"{tag}_det_mode"] = v.mode
            summaries.append(v.summary)
            if v.status != "pass":
                bad.append(v.summary)
    return CheckResult(
        status="fail" if bad else "pass", where="compile-only",
        summary="; ".join(bad) if bad else " | ".join(summaries),
        metrics=metrics,
        details={"table": {"columns": A.ROW_COLUMNS, "rows": rows},
                 "note": "static instruction sites in the compiled PTX/SASS (compile-only), not executions"})


@check("census.pdl_waits", title="Every backward kernel FA4 launches with PDL waits for its predecessor",
       needs={"cpu", "fa4"}, profiles={"default", "full", "exhaustive"})
def pdl_waits(ctx: CheckContext) -> CheckResult:
    """Compile FA4's backward (sm_90a and sm_100a, hd 128) and check that each kernel FA4's source
    launches with programmatic dependent launch has ``griddepcontrol.wait`` in its PTX
    (:mod:`fa4verify.compile.census_pdl`): a dropped wait lets it read what the kernel before it
    has not written yet, which timing on a GPU rarely shows. Evidence: compile-only. One compile
    per arch (~9 s on 2 cores), so it runs in the default profile."""
    from fa4verify.compile import census as C
    from fa4verify.compile.census_pdl import COLUMNS, cached_rows, pdl_rows
    from fa4verify.races import pdl_in_source
    files = pdl_in_source()
    cache = ctx.kernel_cache
    rows, hits = [], []
    with tempfile.TemporaryDirectory(prefix="fa4pdl-") as wd, \
            ctx.progress(2, "compiling FA4 backward for its PDL waits") as bar:
        for arch in ("sm_90a", "sm_100a"):
            got, hit = cached_rows(arch, cache, lambda a=arch: pdl_rows(
                C.compile_case(C.CensusCase(a, 128, backward=True), wd), files), files)
            rows += got
            hits += [arch] if hit else []
            bar.advance(1)
    if hits:
        ctx.note(f"PTX counts of {', '.join(hits)} read from the census cache in {cache} (Note [Census cache]: "
                 "same FA4 source, DSL and driver)")
    pdl = [r for r in rows if r.pdl]
    bad = [r for r in rows if r.status == "fail"]
    table = {"columns": COLUMNS, "rows": [r.row() for r in rows]}
    metrics = {"pdl_kernels": len(pdl), "pdl_kernels_without_wait": len(bad), "archs_from_cache": len(hits)}
    if not pdl:
        return CheckResult(status="undecided", where="compile-only", metrics=metrics, details={"table": table},
                           summary="FA4's source launches no backward kernel with PDL here: nothing to check")
    if bad:
        return CheckResult(status="fail", where="compile-only", metrics=metrics, details={"table": table},
                           summary="launched with PDL but never waits (griddepcontrol.wait absent from its PTX): "
                                   + ", ".join(f"{r.arch} {r.module}" for r in bad))
    return CheckResult(status="pass", where="compile-only", metrics=metrics, details={"table": table},
                       summary=f"{len(pdl)} backward kernels launched with PDL ("
                               + ", ".join(sorted({f'{r.arch} {r.module}' for r in pdl})) + ") each wait")


@check("census.aux_scalars", title="A score_mod's aux_scalars reach FA4's kernel at run time, not folded into it",
       needs={"cpu", "fa4"}, profiles={"full", "exhaustive"})
def aux_scalars(ctx: CheckContext) -> CheckResult:
    """Compile FA4's forward with ``score_mod = score + aux_scalars[0]`` (sm_90a and sm_100a, a
    ``cutlass.Float32``; sm_90a also the Python float FA4's docstring shows) and read the PTX: FA4
    keys its kernels on the scalars' types only, so the value must be a launch parameter, never an
    immediate (Note [Runtime scalars], :mod:`fa4verify.compile.census_aux`). Compile-only, three
    compiles (~10 s each on 2 cores): full and exhaustive profiles."""
    from fa4verify.compile.census_aux import compile_aux, judge
    plan = [("sm_90a", "float32"), ("sm_100a", "float32"), ("sm_90a", "python")]
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="fa4aux-") as wd, \
            ctx.progress(len(plan), "compiling FA4 forward with an aux scalar") as bar:
        for arch, form in plan:
            rows[f"{arch} {form}"] = compile_aux(arch, form, wd)
            bar.advance(1)
    status, summary = judge(rows)
    table = {"columns": ["arch x scalar", "compiled", "value as PTX immediate", ".param .f32 of the kernel",
                         "error"],
             "rows": [[k, r["compiled"], r["immediate"], r["f32_params"], r["error"] or ""] for k, r in rows.items()]}
    metrics = {"folded": sum(1 for r in rows.values() if r["compiled"] and r["immediate"]),
               "python_float_compiles": int(rows["sm_90a python"]["compiled"])}
    return CheckResult(status=status, where="compile-only", summary=summary, metrics=metrics,
                       details={"table": table})
