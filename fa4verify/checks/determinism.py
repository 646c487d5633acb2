"""Audit checks for bitwise reproducibility of the deterministic backward (fa4verify.determinism).

* ``determinism.harness``  the checker itself: an out-of-bounds write, an unwritten element and
                           a one-bit run-to-run difference are each caught (fp32 torch reference
                           with injected faults; "CPU").
* ``determinism.twin``     per arch: the CPU twin's fixed dQ order (``deterministic=True``) is
                           bitwise reproducible, and the mutation ``dq_shuffled_order`` is
                           detected ("CPU twin").
* ``determinism.fa4``      (cuda) production FA4: ``deterministic=True`` backward bitwise
                           reproducible with guard bands and NaN pre-fill, default-mode divergence,
                           and the recorded manifest (kernels/evidence/determinism) compared when the
                           environment matches ("measured on <GPU> (sm_XY)").

Work grows with the profile: quick/default use few runs in this process; ``full`` runs the whole
``h200`` matrix with 100 runs x 3 fresh processes (what ``fa4verify determinism`` does).
"""
from __future__ import annotations

import dataclasses
import tempfile

from fa4verify.audit.registry import CheckContext, CheckResult, check

_TWIN_RUNS = {"quick": 2, "default": 2, "full": 5, "exhaustive": 20}
# (configurations, runs per process, processes, default-mode runs)
_FA4_PLAN = {
    "quick": (("mha-hd128-causal", "gqa-hd128-full-tile"), 10, 1, 3),
    "default": (("mha-hd64-full-edge", "mha-hd128-causal", "gqa-hd128-full-tile",
                 "mqa-hd128-causal-sq<sk", "mha-hd128-causal-sink", "gqa-hd64-varlen-causal"),
                20, 1, 5),
    "full": (("h200",), 100, 3, 40),
    "exhaustive": (("h200",), 1000, 3, 100),
}


#: device of determinism.fa4 (tests swap in "cpu" with a CPU backend)
_FA4_DEVICE = "cuda:0"


def _backward_dtype(ctx: CheckContext) -> str:
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"FA4's backward takes bf16/fp16 only (dtype {ctx.dtype})")
    return ctx.dtype


@check("determinism.harness", title="Determinism checker catches OOB writes, unwritten elements, "
       "one-bit differences", needs={"cpu"})
def harness(ctx: CheckContext) -> CheckResult:
    import torch

    from fa4verify import determinism as d

    cfg = d.select_configs("mha-hd64-full")[0]

    class OutOfBounds(d.TorchMathBackend):
        def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
            g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
            torch.as_strided(dv, (dv.numel() + 1,), (1,), dv.storage_offset())[-1] = 1.0
            return g

    class Unwritten(d.TorchMathBackend):
        def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
            g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
            dk.view(-1)[7] = float("nan")
            return g

    class OneBit(d.TorchMathBackend):
        n = 0

        def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
            g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
            if self.n:
                g.dq.view(-1).view(torch.int16)[0] ^= 1
            self.n += 1
            return g

    expect = {"clean": (d.TorchMathBackend, "reproducible"),
              "out-of-bounds": (OutOfBounds, "guard-violation"),
              "unwritten": (Unwritten, "unwritten"),
              "one-bit": (OneBit, "not-reproducible")}
    got = {}
    with ctx.progress(len(expect), "injected faults") as bar:
        for name, (cls, _) in expect.items():
            rec = d.run_config(cls(), cfg, "cpu", runs=2)
            got[name] = d.aggregate([dict(results=[rec])], [cfg])["configs"][0]["status"]
            bar.advance(1)
    missed = [n for n, (_, want) in expect.items() if got[n] != want]
    return CheckResult(
        status="fail" if missed else "pass", where="CPU",
        summary=(f"missed: {missed} (got {got})" if missed else
                 "clean run reproducible; OOB write, unwritten element, 1-bit flip all caught"),
        metrics={"faults_missed": len(missed)}, details={"statuses": got})


@check("determinism.twin", title="CPU twin: deterministic dQ order reproducible, "
       "dq_shuffled_order detected", needs={"cpu"}, archs={"sm90", "sm100"})
def twin(ctx: CheckContext) -> CheckResult:
    from fa4verify import determinism as d
    dt = _backward_dtype(ctx)
    try:
        from fa4verify.kernels.twin import attention as ta
        from fa4verify.kernels.twin import backward as twin_bwd  # noqa: F401
    except ImportError as ex:
        ctx.skip(f"CPU twin backward not available: {ex}")
    runs = _TWIN_RUNS.get(ctx.profile, 2)
    cfgs = [dataclasses.replace(c, dtype=dt) for c in d.select_configs(
        "mha-hd64-kv-tiles" if ctx.profile_level <= 1 else "mha-hd64-kv-tiles,"
        "mqa-hd128-causal-kv-tiles")]
    statuses, mutation = {}, {}
    with ctx.progress(2 * len(cfgs), "twin backward") as bar:
        for c in cfgs:
            rec = d.run_config(d.TwinBackend(arch=ctx.arch), c, "cpu", runs=runs)
            statuses[c.name] = d.aggregate([dict(results=[rec], arch=ctx.arch)],
                                           [c])["configs"][0]["status"]
            bar.advance(1)
            if "dq_shuffled_order" in getattr(ta, "MUTATIONS", ()):
                mb = d.TwinBackend(arch=ctx.arch, mutations=["dq_shuffled_order"])
                mrec = d.run_config(mb, c, "cpu", runs=4)
                mutation[c.name] = d.aggregate([dict(results=[mrec], arch=ctx.arch)],
                                               [c])["configs"][0]["status"]
            bar.advance(1)
    # Note [Blame]: a configuration whose run errored measured nothing: an error, not "not reproducible"
    errored = {n: s for n, s in list(statuses.items()) + list(mutation.items()) if s in ("error", "not-run")}
    bad = {n: s for n, s in statuses.items() if s != "reproducible" and n not in errored}
    undetected = [n for n, s in mutation.items() if s != "not-reproducible" and n not in errored]
    ok = not bad and not undetected
    if ok and errored:
        return CheckResult(status="error", where="CPU twin",
                           summary=f"the run errored (nothing measured) for {errored}",
                           metrics={"configs_errored": len(errored)},
                           details={"statuses": statuses, "mutation": mutation, "runs": runs})
    return CheckResult(
        status="pass" if ok else "fail", where="CPU twin",
        summary=(f"{len(statuses)} config(s) x {runs} runs bitwise identical; dq_shuffled_order "
                 f"detected in {len(mutation) - len(undetected)}/{len(mutation)}" if ok else
                 f"not reproducible: {bad}; mutation undetected: {undetected}"),
        metrics={"twin_configs_not_reproducible": len(bad),
                 "mutation_undetected": len(undetected)},
        details={"statuses": statuses, "mutation": mutation, "runs": runs})


def _fa4_configs(ctx: CheckContext, dt: str):
    from fa4verify import determinism as d
    names, runs, procs, ndef = _FA4_PLAN.get(ctx.profile, _FA4_PLAN["default"])
    cfgs = d.select_configs(list(names))
    if dt == "fp16":
        cfgs = tuple(dataclasses.replace(c, dtype="fp16") for c in cfgs)
    return cfgs, runs, procs, ndef


def _fa4_cases(ctx: CheckContext) -> list:
    """The plan's configurations, one case each; ``full``/``exhaustive`` run their matrix in
    fresh processes (``spawn_workers``) as one case."""
    cfgs, _runs, procs, _ndef = _fa4_configs(ctx, _backward_dtype(ctx))
    return list(cfgs) if procs <= 1 else [tuple(cfgs)]


def _fa4_cases_summary(ctx: CheckContext, results: list) -> CheckResult:
    cfgs, _runs, procs, _ndef = _fa4_configs(ctx, _backward_dtype(ctx))
    fatal = [r["fatal"] for _c, r in results if r.get("fatal")]
    if fatal:
        return CheckResult(status="error", summary=f"worker failure: {fatal[0]}")
    head = results[0][1]
    if procs <= 1:
        records = [dict(results=[r["record"] for _c, r in results], arch=head["arch"],
                        where=head["be_where"], process_index=0)]
    else:
        records = head["records"]
    return _fa4_summary(ctx, [{"records": records, "where": head["where"],
                               "environment": head["environment"]}], list(cfgs))


def _fa4_compiles(ctx: CheckContext) -> list:
    """Note [Fake device audit]: the FA4 calls of :func:`fa4`: per configuration the forward and
    the deterministic backward, and the default-mode backward where the plan runs it."""
    from fa4verify.problem import AttentionProblem
    from fa4verify.compile.production import CompileCall
    cfgs, _runs, _procs, ndef = _fa4_configs(ctx, _backward_dtype(ctx))
    arch = ctx.require_gpu().arch
    out = []
    for c in cfgs:
        vl = dict(batch=len(c.seqlens_q), seqlen_q=max(c.seqlens_q), seqlen_k=max(c.seqlens_k),
                  seqlens_q=tuple(c.seqlens_q), seqlens_k=tuple(c.seqlens_k)) if c.varlen else \
            dict(batch=c.batch, seqlen_q=c.seqlen_q, seqlen_k=c.seqlen_k)
        p = AttentionProblem(arch=arch, dtype=c.dtype, nheads=c.nheads, nheads_kv=c.nheads_kv,
                             head_dim=c.head_dim, head_dim_v=c.hdv, causal=c.causal, window_size=tuple(c.window),
                             softcap=float(c.softcap), sink=bool(c.sink), **vl)
        out.append(CompileCall("backward", p, deterministic=True, purpose=f"{c.name}: bitwise reruns"))
        if ndef:
            out.append(CompileCall("backward", p, deterministic=False, purpose=f"{c.name}: default-mode divergence"))
    return out


@check("determinism.fa4", title="FA4 deterministic backward: bitwise reproducible, guard bands "
       "intact, default-mode divergence", needs={"cuda", "fa4"},
       profiles={"quick", "default", "full", "exhaustive"}, cost=50,
       cases=_fa4_cases, summarise=_fa4_cases_summary, compiles=_fa4_compiles)
def fa4(ctx: CheckContext, case) -> dict:
    from fa4verify import determinism as d
    try:
        be = d.load_backend("fa4")
    except EnvironmentError as ex:
        ctx.skip(str(ex))
    _cfgs, runs, procs, ndef = _fa4_configs(ctx, _backward_dtype(ctx))
    dev = _FA4_DEVICE
    out = {"arch": be.arch, "be_where": be.where, "where": ctx.where_measured(),
           "environment": be.environment(dev)}
    if not isinstance(case, tuple):
        return dict(out, record=d.run_config(be, case, dev, runs=runs, default_runs=ndef))
    spec = d.worker_spec("fa4", list(case), [dev], runs=runs, default_runs=ndef)
    with tempfile.TemporaryDirectory(prefix="fa4v-det-") as wd:
        records = d.spawn_workers(spec, procs, wd)
    return dict(out, records=records, fatal=next((r["fatal"] for r in records if r.get("fatal")), None))


def _fa4_summary(ctx: CheckContext, pays: list, cfgs: list) -> CheckResult:
    from fa4verify import determinism as d
    from fa4verify.kernels.evidence import evidence_path
    _, runs, procs, _ = _FA4_PLAN.get(ctx.profile, _FA4_PLAN["default"])
    records = []
    for p in pays:
        for r in p["records"]:
            if procs <= 1 and records:
                records[0]["results"].extend(r["results"])   # one process for every case
            else:
                records.append(dict(r, results=list(r["results"])))
    order = {c.name: j for j, c in enumerate(cfgs)}
    for r in records:
        r["results"].sort(key=lambda x: order.get(x.get("name"), len(order)))
    rep = d.aggregate(records, cfgs)
    where = pays[0]["where"]
    counts = rep["counts"]
    # Note [Blame]: a configuration whose run errored measured nothing about FA4: it makes the
    # check an error (with the reason), never "NOT reproducible"
    errored = [c for c in rep["configs"] if c["status"] == "error"]
    failing = [c for c in rep["configs"] if c["status"] in d.FAILING and c["status"] != "error"]
    # recorded manifest, compared when this environment is the recorded one
    manifest_note, mismatches = "", 0
    ref_path = evidence_path("determinism/h200_manifest.json")
    if ref_path.exists():
        ref = d.load_manifest(str(ref_path))
        cur = d.build_manifest(rep, pays[0]["environment"])
        cmp_ = d.compare_manifests(cur, ref)
        mismatches = sum(1 for e in cmp_["entries"] if e["outcome"] == "mismatch")
        manifest_note = f"; recorded manifest: {cmp_['verdict']}"
    max_ulp = 0
    for c in rep["configs"]:
        for t in (c.get("default_mode") or {}).get("tensors", {}).values():
            max_ulp = max(max_ulp, t["max_ulp"])
    status = "fail" if failing or mismatches else ("error" if errored else "pass")
    if not failing and not errored and not any(c["status"] in ("reproducible", "xpass", "xfail")
                                               for c in rep["configs"]):
        status = "skip"
    summary = (", ".join(f"{k}={v}" for k, v in counts.items())
               + f" ({runs} runs x {procs} proc){manifest_note}")
    if errored:
        summary = (f"{len(errored)} configuration(s) errored, nothing measured: "
                   + "; ".join(f"{c['name']}: {c.get('reason', '?')}"[:200] for c in errored[:3]) + "; " + summary)
    if failing:
        summary = "NOT reproducible: " + ", ".join(f"{c['name']} ({c['status']})"
                                                   for c in failing) + "; " + summary
    return CheckResult(
        status=status, where=where, summary=summary,
        metrics={"configs_failing": len(failing), "configs_errored": len(errored),
                 "manifest_mismatches": mismatches,
                 "configs_reproducible_higher_is_better": counts.get("reproducible", 0)
                 + counts.get("xpass", 0),
                 "default_mode_max_ulp": max_ulp},
        details={"report": rep})
