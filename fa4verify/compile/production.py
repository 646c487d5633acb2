"""Compile-only production FA4 through the target layer: :class:`~fa4verify.targets.ProductionTarget`
with ``fake=True``, no GPU.

:func:`run_cases` starts **one** Python subprocess per compile target (``sm_100a`` / ``sm_103a`` /
``sm_90a``) with the census' environment (:func:`fa4verify.compile.census.compile_env`: ``CUTE_DSL_ARCH``,
``FLASH_ATTENTION_ARCH``, ``FLASH_ATTENTION_NUM_SMS``, ``CUTE_DSL_KEEP=ptx``, an existing
``CUTE_DSL_DUMP_DIR``) and the adapter's compile-only shims (:func:`fa4verify.kernels.adapter.install_compile_only_shims`), so
neither leaks into the calling process. In it every :class:`CompileCase` becomes an
:class:`~fa4verify.problem.AttentionProblem`, is materialised, and runs
``ProductionTarget(fake=True, emulation=...)`` forward (and backward, deterministic or default):
FA4 traces and compiles its kernels for ``FLASH_ATTENTION_ARCH`` under torch ``FakeTensorMode`` and
skips the launch. Per case the result records what the adapter saw (``CallConfig``: kernel family
``arch``, FA4's own compile key, tile, 2-CTA, exp2 emulation), the kernel classes whose PTX the DSL
dumped during the call (read from the dump file names, e.g. ``FlashAttentionBackwardSm100``), the
output shapes, the target's ``where`` (``"compile-only"``), the wall time, and any error.

Outputs are shapes, not values: every figure from here is **compile-only**.

``inject`` (tests only) breaks the SM100 path on purpose inside the subprocess, so a test can
show that its assertions fail: ``"raise"`` makes the adapter entry point raise;
``"skip-fa4"`` replaces it by a stand-in that returns the right shapes and claims ``arch=100``
without calling FA4 (nothing compiles, no compile key).

Note [Fake device audit]
------------------------
``fa4verify audit --fake-device b200`` is the audit of a GPU this machine does not have
(Note [Fake device] in :mod:`fa4verify.kernels.device`): :func:`enter_fake_device` sets, for
the audit and its workers, the device and the compile target (``CUTE_DSL_ARCH``,
``FLASH_ATTENTION_ARCH``, ``FLASH_ATTENTION_NUM_SMS`` of the census). The CPU checks run as on
any machine. A check that needs "cuda" runs compile-only (:func:`audit_spec`): its cases are the
FA4 calls it declares (``@check(compiles=...)`` -> :class:`CompileCall`), each compiled in the
engine's workers -- FA4's kernel cache on, as in any GPU audit, a deadline per task -- by
``ProductionTarget(fake=True)`` under FakeTensorMode, the exp2-emulation-off variants included;
its verdict is ``skip`` labelled "compile-only" listing what compiled (no value was computed,
so nothing passed), ``error`` naming the call where FA4 could not compile it, and a skip saying
why where the check's calls cannot be known without the GPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["INJECTIONS", "CompileCase", "kernel_class", "run_cases", "CompileCall", "enter_fake_device",
           "audit_spec"]

INJECTIONS = ("", "raise", "skip-fa4")


@dataclass(frozen=True)
class CompileCase:
    """One production call through ``ProductionTarget(fake=True)``: ``op`` "forward" or
    "backward" (the backward case runs the target's forward first and feeds FA4's fake O/LSE to
    it, as :meth:`ProductionTarget.backward` does with ``Fwd.native``)."""
    op: str = "forward"
    head_dim: int = 128
    causal: bool = False
    deterministic: bool = False          # backward only
    emulation: str = "default"           # "default" | "disabled" (ProductionTarget(emulation=...))
    dtype: str = "bf16"
    batch: int = 1
    seqlen: int = 256
    nheads: int = 2
    inject: str = ""
    #: a whole :class:`~fa4verify.problem.AttentionProblem` as JSON (e.g. a drawn call form: paged
    #: KV, seqused_k, block sparsity); replaces the shape fields above when set
    problem_json: str = ""

    def __post_init__(self) -> None:
        if self.op not in ("forward", "backward"):
            raise ValueError(f"op={self.op!r}: expected 'forward' or 'backward'")
        if self.inject not in INJECTIONS:
            raise ValueError(f"inject={self.inject!r}: expected one of {INJECTIONS}")

    def label(self) -> str:
        s = f"{self.op[:3]}-hd{self.head_dim}-{'causal' if self.causal else 'noncausal'}"
        if self.op == "backward":
            s += "-det" if self.deterministic else "-default"
        if self.emulation != "default":
            s += f"-emu_{self.emulation}"
        if self.inject:
            s += f"-INJECT_{self.inject}"
        if self.problem_json:
            import hashlib
            s = f"{self.op[:3]}-problem-{hashlib.sha256(self.problem_json.encode()).hexdigest()[:8]}"
        return s


_KERNEL_RE = re.compile(r"(FlashAttention[A-Za-z0-9]+?)_object")


def kernel_class(dump_name: str) -> Optional[str]:
    """FA4 kernel class from a DSL dump file name (``...flash_bwd_sm100FlashAttentionBackwardSm100_object_at...``)."""
    m = _KERNEL_RE.search(dump_name)
    return m.group(1) if m else None


def _fa_arch(arch: str) -> str:
    from fa4verify.kernels.facts import arch_of_ptx_target
    return arch_of_ptx_target(arch)


# ----------------------------------------------------------------------------------------------
# subprocess side
# ----------------------------------------------------------------------------------------------

def _inject(ad, case: CompileCase):
    """Monkeypatch the adapter entry point of ``case.op``; returns an undo callable."""
    name = case.op
    orig = getattr(ad, name)
    if case.inject == "raise":
        def broken(*a, **k):
            raise RuntimeError(f"injected: broken SM100 {name} path")
    else:   # "skip-fa4": right shapes, claims arch 100, compiles nothing
        import torch

        def broken(q, k, v, *rest, **kw):
            cfg = {"op": name, "arch": 100, "compile_key": None, "exp2_emulation": "stand-in"}
            if name == "forward":
                b, s, h, _ = q.shape
                return ad.ForwardResult(torch.empty(b, s, h, v.shape[-1], dtype=q.dtype, device="cuda"),
                                        torch.empty(b, h, s, dtype=torch.float32, device="cuda"), cfg)
            return ad.BackwardResult(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, cfg)
    setattr(ad, name, broken)
    return lambda: setattr(ad, name, orig)


def _summary_config(d: dict) -> dict:
    key = d.get("compile_key") or None
    keep = ("op", "entry", "arch", "dtype", "q_shape", "causal", "deterministic", "tile_mn", "use_2cta",
            "tuning_key", "exp2_emulation", "emulated_share", "pack_gqa", "return_lse")
    out = {k: d.get(k) for k in keep}
    out["compile_key"] = key
    return out


def _run_one(case: CompileCase, dump: Path) -> dict[str, Any]:
    import numpy as np

    from fa4verify.problem import AttentionProblem
    from fa4verify.kernels import adapter as ad
    from fa4verify.targets import ProductionTarget
    arch = _fa_arch(os.environ["CUTE_DSL_ARCH"])
    if case.problem_json:
        prob = AttentionProblem.from_json(case.problem_json).replace(arch=arch)
    else:
        prob = AttentionProblem(arch=arch, dtype=case.dtype, batch=case.batch, seqlen_q=case.seqlen,
                                seqlen_k=case.seqlen, nheads=case.nheads, nheads_kv=case.nheads,
                                head_dim=case.head_dim, head_dim_v=case.head_dim, causal=case.causal)
    rec: dict[str, Any] = {"case": asdict(case), "label": case.label(), "ok": False, "error": None,
                           "where": None, "target_arch": None, "forward_config": None,
                           "backward_config": None, "kernels": [], "shapes": {}}
    sh = prob.shapes()
    lse_shape = list(prob.fully_masked_rows().shape)      # FA4's LSE layout of the problem
    rec["expected_shapes"] = ({"out": list(sh["out"]), "lse": lse_shape} if case.op == "forward" else
                              {"dq": list(sh["q"]), "dk": list(sh["k"]), "dv": list(sh["v"])})
    before = _snapshot(dump)
    undo = None
    t0 = time.time()
    try:
        a = prob.materialize()
        tgt = ProductionTarget(fake=True, emulation=case.emulation)
        rec["where"], rec["target_arch"] = tgt.where, tgt.arch
        if case.inject and case.op == "forward":
            undo = _inject(ad, case)
        f = tgt.forward(prob, a)
        rec["forward_config"] = _summary_config(tgt.last_config or {})
        rec["shapes"].update(out=list(f.out.shape), lse=list(f.lse.shape))
        if case.op == "backward":
            if case.inject:
                undo = _inject(ad, case)
            r = tgt.backward(prob, a, f, deterministic=case.deterministic)
            rec["backward_config"] = _summary_config(tgt.last_config or {})
            rec["shapes"].update(dq=list(r.dq.shape), dk=list(r.dk.shape), dv=list(r.dv.shape))
            rec["values_are_zero"] = bool(all(not np.any(x) for x in (r.dq, r.dk, r.dv)))
        rec["describe"] = {k: v for k, v in tgt.describe().items() if k != "versions"}
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded; the caller decides
        rec["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        if undo is not None:
            undo()
    rec["seconds"] = round(time.time() - t0, 2)
    # dump names come from the kernel signature, not FA4's compile key: a recompile of the same
    # class overwrites its file, so "compiled during this call" = new or rewritten since before
    after = _snapshot(dump)
    new = sorted(n for n, m in after.items() if n.endswith(".ptx") and before.get(n) != m)
    rec["kernels"] = [kernel_class(n) or n[:80] for n in new]
    return rec


def _snapshot(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


def _worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    t0 = time.time()
    from fa4verify.kernels.adapter import install_compile_only_shims
    install_compile_only_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
    import torch  # noqa: F401

    from fa4verify.kernels import adapter  # noqa: F401  (imports flash_attn.cute)
    import_s = time.time() - t0
    dump = Path(os.environ["CUTE_DSL_DUMP_DIR"])
    results = []
    for c in spec["cases"]:
        results.append(_run_one(CompileCase(**c), dump))
        Path(spec["result"]).write_text(json.dumps({"import_seconds": round(import_s, 2),
                                                    "results": results}))


# ----------------------------------------------------------------------------------------------
# caller side
# ----------------------------------------------------------------------------------------------

def run_cases(arch: str, cases: Sequence[CompileCase], workdir: str | os.PathLike | None = None,
              timeout: float = 600.0, kernel_cache: str | os.PathLike | None = None) -> dict[str, Any]:
    """Run ``cases`` for compile target ``arch`` ("sm_100a", "sm_103a", "sm_90a") in one
    subprocess. Returns ``{"arch", "wall_seconds", "import_seconds", "results": [per case]}``.
    ``kernel_cache``: FA4's persistent kernel cache on, in that directory (as in an audit's
    workers), else off.
    A case that fails records its error (``ok`` False); raises ``RuntimeError`` only when the
    subprocess itself dies (with its stderr tail)."""
    from fa4verify.compile.census import compile_env
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fa4compile-"))
    dump = (base / f"{arch}-dump").resolve()
    dump.mkdir(parents=True, exist_ok=True)
    result = dump / "_results.json"
    if result.exists():
        result.unlink()
    env = compile_env(arch, dump, base / "dsl-cache", keep="ptx")
    if kernel_cache is not None:
        env.update(FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1", FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(kernel_cache))
    spec = json.dumps({"cases": [asdict(c) for c in cases], "result": str(result)})
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c",
                        "import sys; from fa4verify.compile.production import _worker; _worker(sys.argv[1])", spec],
                       env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    if r.returncode != 0 or not result.exists():
        raise RuntimeError(f"compile-only subprocess for {arch} died (rc={r.returncode}): {r.stderr[-3000:]}")
    data = json.loads(result.read_text())
    if len(data["results"]) != len(cases):
        raise RuntimeError(f"compile-only subprocess for {arch} stopped after {len(data['results'])} of "
                           f"{len(cases)} cases: {r.stderr[-3000:]}")
    return {"arch": arch, "wall_seconds": round(wall, 2), **data}


if __name__ == "__main__":  # pragma: no cover
    import argparse
    ap = argparse.ArgumentParser(description="compile-only production FA4 through ProductionTarget(fake=True)")
    ap.add_argument("--arch", default="sm_100a", choices=["sm_90a", "sm_100a", "sm_103a"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ns = ap.parse_args()
    cs = [CompileCase("forward", ns.head_dim, ns.causal),
          CompileCase("backward", ns.head_dim, ns.causal, deterministic=True),
          CompileCase("backward", ns.head_dim, ns.causal, deterministic=False)]
    print(json.dumps(run_cases(ns.arch, cs), indent=1))


# ----------------------------------------------------------------------------------------------
# Note [Fake device audit]
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompileCall:
    """One FA4 call a check makes on the audited GPU (Note [Fake device audit]): ``op`` "forward"
    or "backward" (the target's forward first, its O and LSE fed to the backward, as the checks
    do) or "combine" (``flash_attn_combine`` of ``splits`` fp32 partials of the problem's output
    shape, in the problem's dtype), ``emulation`` "default" or "disabled" (SM100's exp2 emulation
    off), ``deterministic`` (backward), ``purpose``: what the check uses it for (reports),
    ``dlse``: the backward also runs with a gradient through the LSE where the check's dLSE pass
    would (Note [A gradient through the LSE]: the calls the target takes it on, varlen included)."""
    op: str
    problem: Any
    emulation: str = "default"
    deterministic: bool = True
    purpose: str = ""
    splits: int = 0
    dlse: bool = False
    #: a combine's index arguments besides ``cu_seqlens`` (a varlen problem): ``seqused``,
    #: ``virtual_batch_idx`` (Note [Used rows and virtual batches] in fa4verify.checks.combine)
    index: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in ("forward", "backward", "combine"):
            raise ValueError(f"op={self.op!r}: expected 'forward', 'backward' or 'combine'")
        if (self.op == "combine") != (self.splits > 1):
            raise ValueError(f"splits={self.splits}: a combine merges two splits or more; only a combine has them")
        if self.emulation not in ("default", "disabled"):
            raise ValueError(f"emulation={self.emulation!r}: expected 'default' or 'disabled'")

    def describe(self) -> str:
        p = self.problem
        mask = "causal" if p.causal else ("window" if p.local else "full")
        s = (f"{self.op} {p.arch} {p.dtype} b{p.batch} s{p.seqlen_q}/{p.seqlen_k} h{p.nheads}/{p.nheads_kv} "
             f"d={p.head_dim} {mask}")
        if self.op == "backward":
            s += " deterministic" if self.deterministic else " default-mode"
        if self.op == "combine":
            s += f" {self.splits} splits" + "".join(f" +{k}" for k in self.index)
        if self.emulation == "disabled":
            s += " exp2-emulation-off"
        return s + (f" ({self.purpose})" if self.purpose else "")


def enter_fake_device(key: str) -> dict[str, str]:
    """Make this process (and the workers it starts) the fake device ``key`` (Note [Fake device
    audit]); returns the variables set. ValueError for an unknown key."""
    from fa4verify.compile.census import COMPILE_ARCHS
    from fa4verify.kernels import device, facts
    gpu = device.FAKE_DEVICES.get(str(key).strip().lower())
    if gpu is None:
        raise ValueError(f"--fake-device {key!r}: choose from {', '.join(device.FAKE_DEVICES)}")
    target = facts.ptx_target(gpu.arch)
    fa_arch, sms = COMPILE_ARCHS[target]
    env = {device.FAKE_DEVICE_ENV: str(key).strip().lower(), "CUTE_DSL_ARCH": target,
           "FLASH_ATTENTION_ARCH": fa_arch, "FLASH_ATTENTION_NUM_SMS": sms}
    for k in ("FA_DISABLE_2CTA", "FA_CLC"):           # knobs that would change FA4's kernel choice
        os.environ.pop(k, None)
    os.environ.update(env)
    device.local_gpu.cache_clear()
    return env


_SHIMS = False


def _shims() -> None:
    global _SHIMS
    if not _SHIMS:
        from fa4verify.kernels.adapter import install_compile_only_shims
        install_compile_only_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
        from fa4verify.compile import launch_limits
        launch_limits.install()        # Note [Launch limits, compile-only]
        _SHIMS = True


def _run_call(ctx: Any, call: CompileCall) -> dict[str, Any]:
    """One :class:`CompileCall` in this (fake-device) process: FA4 traces and compiles, nothing
    launches. FA4 refusing the call (the check on the GPU would not run it either) is recorded as
    ``refused`` with FA4's reason; any other failure is the case's error."""
    from fa4verify.kernels.device import fake_device
    from fa4verify.targets import ProductionTarget
    from fa4verify.errors import Unsupported
    if fake_device() is None:
        raise RuntimeError("a compile-only call outside a fake-device process (Note [Fake device audit])")
    _shims()
    from fa4verify.compile import launch_limits
    launch_limits.take()            # this call's compiles only
    t0 = time.time()

    def launches() -> dict[str, Any]:
        over, read, unread = launch_limits.take()
        return {"launch_over_limit": over, "kernels_read": read, "kernels_unread": unread}
    try:
        tgt = ProductionTarget(fake=True, emulation=call.emulation)
        if call.op == "combine":
            import torch
            from fa4verify.kernels import adapter
            p = call.problem
            with tgt._mode():
                odt = torch.bfloat16 if p.dtype == "bf16" else torch.float16
                index = {k: torch.empty(p.batch, dtype=torch.int32, device="cuda") for k in call.index}
                if p.varlen:      # packed partials with cu_seqlens (Note [The varlen combine])
                    tq = sum(p.seqlens_q)
                    o = torch.empty(call.splits, tq, p.nheads, p.head_dim_v, dtype=torch.float32, device="cuda")
                    lse = torch.empty(call.splits, p.nheads, tq, dtype=torch.float32, device="cuda").transpose(-1, -2)
                    cu = torch.empty(p.batch + 1, dtype=torch.int32, device="cuda")
                    _, _, cfg = adapter.combine(o, lse, out_dtype=odt, cu_seqlens=cu, **index)
                else:
                    o = torch.empty(call.splits, p.batch, p.seqlen_q, p.nheads, p.head_dim_v, dtype=torch.float32,
                                    device="cuda")
                    lse = torch.empty(call.splits, p.batch, p.nheads, p.seqlen_q, dtype=torch.float32,
                                      device="cuda").transpose(-1, -2)       # seqlen-contiguous, as FA4 asks
                    _, _, cfg = adapter.combine(o, lse, out_dtype=odt, **index)
            return {"call": call.describe(), "where": tgt.where, "arch": tgt.arch,
                    "configs": [_summary_config(cfg)], "seconds": round(time.time() - t0, 2), **launches()}
        a = call.problem.materialize()
        f = tgt.forward(call.problem, a)
        cfgs = [_summary_config(tgt.last_config or {})]
        if call.problem.call is not None and call.problem.call.inference:     # its own kernel: no LSE store
            tgt.forward_inference(call.problem, a)
            cfgs.append(_summary_config(tgt.last_config or {}))
        no_bwd = tgt.backward_unsupported(call.problem) if call.op == "backward" else None
        if call.op == "backward" and no_bwd is None:
            tgt.backward(call.problem, a, f, deterministic=call.deterministic)
            cfgs.append(_summary_config(tgt.last_config or {}))
            if call.dlse and tgt.dlse_unsupported(call.problem) is None:
                import numpy as np
                tgt.backward(call.problem, a, f, deterministic=call.deterministic,
                             dlse=np.zeros(np.shape(f.lse), np.float32))
                cfgs.append(_summary_config(tgt.last_config or {}))
    except Unsupported as e:
        return {"call": call.describe(), "refused": str(e)[:300], "seconds": round(time.time() - t0, 2),
                **launches()}
    except Exception as e:  # noqa: BLE001 - FA4 failing the call the way a known issue documents
        # (e.g. sm90_split_auto_refused: FA4 refuses the split its own heuristic chose, Note [Split-KV
        # by FA4's heuristic]) is what the check on the GPU would record; anything else is the case's error
        from fa4verify.fuzz.known_issues import match_known_issue
        from fa4verify.fuzz.violation import Violation
        ki = match_known_issue(call.problem, Violation("runs", f"{type(e).__name__}: {e} | case: "
                                                               f"{call.problem.describe()}"), target="production")
        if ki is None:
            raise
        return {"call": call.describe(), "refused": f"FA4 fails the call (known issue {ki.name}): "
                                                   f"{type(e).__name__}: {e}"[:300],
                "seconds": round(time.time() - t0, 2), **launches()}
    return {"call": call.describe() + (f" [forward only: {no_bwd}]" if no_bwd else ""), "where": tgt.where,
            "arch": tgt.arch, "configs": cfgs, "seconds": round(time.time() - t0, 2), **launches()}


def _summarise(ctx: Any, results: list) -> Any:
    from fa4verify.audit.registry import CheckResult
    gpu = ctx.require_gpu()
    done = [(c, v) for c, v in results if "refused" not in v]
    refused = [v for _c, v in results if "refused" in v]
    rows = [[v["call"], str(v["configs"][-1].get("tile_mn")), str(v["configs"][0].get("exp2_emulation")),
             v["seconds"]] for _c, v in done]
    rows += [[v["call"], "refused by FA4", v["refused"], v["seconds"]] for v in refused]
    emu_off = sum(1 for c, _v in done if c.emulation == "disabled")
    over, known = _launch_verdicts(results)
    read = sum(int(v.get("kernels_read", 0)) for _c, v in results)
    unread = sum(int(v.get("kernels_unread", 0)) for _c, v in results)
    launch = (f"; launch limits read for {read} kernel use(s)"
              + (f"; {unread} kernel use(s) not read (loaded from an FA4 kernel cache filled before launch "
                 "limits were recorded: run once with --kernel-cache off)" if unread else ""))
    if over:
        launch += (f"; {len(over)} call(s) would not launch (shared memory over the per-block limit), first: "
                   f"{over[0]}")
    if known:
        launch += f"; {len(known)} would not launch as known issue(s) say ({', '.join(sorted(set(known.values())))})"
    return CheckResult(
        status="fail" if over else ("undecided" if unread else "skip"), where="compile-only",
        summary=(f"compile-only on a fake {gpu.label}: {len(done)} FA4 call(s) compiled"
                 + (f" ({emu_off} with exp2 emulation off)" if emu_off else "")
                 + (f", {len(refused)} refused by FA4 (first: {refused[0]['refused'][:120]})" if refused else "")
                 + launch + ("" if over else "; nothing ran, so no verdict on values")),
        metrics={"compiled_calls": len(done), "refused_calls": len(refused), "kernels_read": read,
                 "kernels_unread": unread,
                 "launch_over_limit": len(over), "launch_over_limit_known": len(known)},
        details={"table": {"columns": ["FA4 call", "tile", "exp2 emulation", "seconds"], "rows": rows},
                 "configs": [v["configs"] for _c, v in done], "fake_device": gpu.label,
                 "launch_over_limit": over, "launch_over_limit_known": known})


def _launch_verdicts(results: list) -> tuple[list[str], dict[str, str]]:
    """Note [Launch limits, compile-only]: the calls a kernel of which would not launch, as
    (unexplained ``[description]``, explained ``{description: known issue}``): a launch over the
    limit is what CUDA reports as ``CUDA_LAUNCH_INVALID_CONFIG``, matched against the known issues
    as the GPU's violation would be."""
    from fa4verify.fuzz.known_issues import match_known_issue
    from fa4verify.fuzz.violation import Violation
    over: list[str] = []
    known: dict[str, str] = {}
    for c, v in results:
        for name, arch, alloc, mx in v.get("launch_over_limit") or ():
            text = (f"{v['call'][:160]}: kernel {name[:80]} needs {alloc:,} B of shared memory, {arch} allows "
                    f"{mx:,} B")
            problem = getattr(c, "problem", None)
            ki = None
            if problem is not None:
                viol = Violation("runs", f"CUDA_LAUNCH_INVALID_CONFIG (compile-only): {text}", {})
                ki = match_known_issue(problem, viol, target="production")
            if ki is not None:
                known[text] = ki.name
            else:
                over.append(text)
    return over, known


def _no_plan(spec: Any) -> Any:
    def cases(ctx: Any) -> list:
        gpu = ctx.require_gpu()
        ctx.skip(f"compile-only on a fake {gpu.label}: {spec.id} declares no FA4 calls to compile "
                 "(it chooses them while it runs on the GPU)")
    return cases


def audit_spec(spec: Any) -> Any:
    """The check ``spec`` as a compile-only audit of a fake device runs it (Note [Fake device
    audit]): a check that needs "cuda" becomes the :class:`CompileCall` list it declares, compiled;
    every other check is itself. Used by the audit's runner and by the workers alike, so a task
    means the same thing on both sides."""
    import dataclasses as dc

    from fa4verify.kernels.device import fake_device
    if "cuda" not in spec.needs or fake_device() is None:
        return spec
    return dc.replace(spec, func=_run_call, cases=spec.compiles or _no_plan(spec), summarise=_summarise)
