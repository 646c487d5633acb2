"""Compile-only runs of FA4 features through the adapter (no GPU): split-KV (``num_splits``),
paged KV, ``flash_attn_combine``, block sparsity (forward, backward), MLA (``qv``, hd 64 + 512),
top-k gather (``gather_kv_indices``, forward and the sparse MLA backward), fp8 e4m3 with
``q/k/v_descale``, and ``seqused_k`` forward/backward.

:func:`run` starts one subprocess per compile target (``sm_90a`` / ``sm_100a``) with the census'
environment and CPU shims (:func:`fa4verify.compile.census.compile_env`, ``_install_cpu_shims``); in it
each :class:`FeatureCase` makes fake CUDA tensors under torch ``FakeTensorMode`` and calls the
adapter (``forward(..., num_splits=/page_table=)``, ``combine``, ``backward(...,
block_sparse_tensors=)``): FA4 traces and compiles its kernels for ``FLASH_ATTENTION_ARCH`` and
skips the launch. Per case: ok / the error FA4 raised, the kernel classes whose PTX the DSL wrote
(``fa4verify.compile.production.kernel_class``), FA4's compile key, wall seconds.

Every figure from here is **compile-only** (shapes and code, no values). Usage::

    python -m fa4verify.compile.features --arch sm_100a --cases split_kv,paged,combine --json F
    python -m fa4verify.compile.features --arch sm_90a --cases sparse_bwd:208 --json F
    python -m fa4verify.compile.features --arch sm_100a --cases mla_fwd,gather_fwd,gather_bwd --json F

``kind[:n]``: n is the page size (paged), the split count (split_kv, combine), the number of query
heads (mla_fwd, gather_fwd, gather_bwd, gather_bwd_rp: MLA has one KV head) or the head dim.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["FeatureCase", "KINDS", "parse_cases", "run", "merge"]

KINDS = ("split_kv", "paged", "combine", "sparse_bwd", "dense_bwd", "sparse_fwd", "mask_mod_fwd",
         "mla_fwd", "gather_fwd", "gather_bwd", "gather_bwd_rp", "fp8_fwd", "seqused_fwd", "seqused_bwd",
         "mod_fwd", "mod_bwd")
#: kinds whose ``:n`` is the number of query heads (MLA: one KV head); the others take a head dim,
#: a page size (paged) or a split count (split_kv, combine)
_NHEADS_KINDS = ("mla_fwd", "gather_fwd", "gather_bwd", "gather_bwd_rp")
#: MLA shape (FA4's "deepseek MLA absorbed" head dims) and the top-k length of the gather cases
MLA_HEAD_DIM, MLA_HEAD_DIM_V, GATHER_TOPK = 64, 512, 256


@dataclass(frozen=True)
class FeatureCase:
    kind: str                    #: one of KINDS
    head_dim: int = 128
    page_size: int = 128         #: paged only
    num_splits: int = 4          #: split_kv / combine
    seqlen_q: int = 128
    seqlen_k: int = 1024
    nheads: int = 2
    mod: str = ""                #: mod_fwd / mod_bwd: a registered ModPair name (fa4verify.mods)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: expected one of {KINDS}")
        if self.kind in ("mod_fwd", "mod_bwd") and not self.mod:
            raise ValueError(f"{self.kind} needs a mod pair name ({self.kind}:NAME)")

    def label(self) -> str:
        if self.kind in _NHEADS_KINDS:
            return f"{self.kind}-hd{MLA_HEAD_DIM}v{MLA_HEAD_DIM_V}-h{self.nheads}"
        extra = {"paged": f"-p{self.page_size}", "split_kv": f"-s{self.num_splits}",
                 "combine": f"-s{self.num_splits}", "mod_fwd": f"-{self.mod}",
                 "mod_bwd": f"-{self.mod}"}.get(self.kind, "")
        return f"{self.kind}-hd{self.head_dim}{extra}"


def parse_cases(text: str) -> list[FeatureCase]:
    """``"split_kv,paged:64,sparse_bwd:208"`` -> cases (``kind[:n]``: n is the page size for
    paged, the head dim for sparse_bwd, the split count for split_kv/combine)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, n = item.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown case {kind!r} (expected one of {KINDS})")
        kw: dict[str, Any] = {}
        if kind in ("mod_fwd", "mod_bwd"):
            from fa4verify import mods as _mods
            if n not in _mods.names():
                raise ValueError(f"{item!r}: unknown mod pair {n!r} (registered: {', '.join(_mods.names())})")
            out.append(FeatureCase(kind, mod=n))
            continue
        if n:
            if not n.isdigit() or int(n) < 1:
                raise ValueError(f"{item!r}: the number after ':' must be a positive integer")
            if kind in _NHEADS_KINDS:
                kw = {"nheads": int(n)}
            else:
                kw = {"paged": {"page_size": int(n)}, "split_kv": {"num_splits": int(n)},
                      "combine": {"num_splits": int(n)}}.get(kind, {"head_dim": int(n)})
        elif kind in _NHEADS_KINDS:
            kw = {"nheads": 128 if kind in ("gather_fwd", "gather_bwd") else 64 if kind == "gather_bwd_rp" else 16}
        if kind in _NHEADS_KINDS:
            kw["head_dim"] = MLA_HEAD_DIM
        out.append(FeatureCase(kind, **kw))
    if not out:
        raise ValueError("no cases")
    return out


def _one(case: FeatureCase, dump: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4verify.compile.production import kernel_class
    from fa4verify.kernels import adapter as ad
    rec: dict[str, Any] = {"case": asdict(case), "label": case.label(), "ok": False, "error": None,
                           "where": "compile-only", "arch": os.environ.get("CUTE_DSL_ARCH")}
    before = {p.name: p.stat().st_mtime_ns for p in dump.iterdir()}
    t0 = time.time()
    bf = torch.bfloat16
    d, h, sq, sk = case.head_dim, case.nheads, case.seqlen_q, case.seqlen_k
    try:
        with FakeTensorMode():
            q = torch.empty(2, sq, h, d, dtype=bf, device="cuda")
            if case.kind == "split_kv":
                k = torch.empty(2, sk, h, d, dtype=bf, device="cuda")
                f = ad.forward(q, k, torch.empty_like(k), num_splits=case.num_splits)
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
            elif case.kind == "paged":
                per = -(-sk // case.page_size)
                kp = torch.empty(2 * per + 1, case.page_size, h, d, dtype=bf, device="cuda")
                table = torch.empty(2, per, dtype=torch.int32, device="cuda")
                used = torch.empty(2, dtype=torch.int32, device="cuda")
                f = ad.forward(q, kp, torch.empty_like(kp), page_table=table, seqused_k=used)
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
            elif case.kind == "sparse_fwd":
                k = torch.empty(2, sk, h, d, dtype=bf, device="cuda")
                bm = np.ones((-(-sq // 128), -(-sk // 128)), bool)
                bs = ad.block_sparse_tensors(bm, batch=2, nheads=h, block_size=(128, 128), direction="fwd")
                f = ad.forward(q, k, torch.empty_like(k), block_sparse_tensors=bs)
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
            elif case.kind == "mask_mod_fwd":
                from fa4verify.kernels.mask_mods import checkerboard_128
                k = torch.empty(2, sk, h, d, dtype=bf, device="cuda")
                f = ad.forward(q, k, torch.empty_like(k), mask_mod=checkerboard_128)
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
            elif case.kind in ("mod_fwd", "mod_bwd"):
                from fa4verify import mods as _mods
                pair = _mods.get(case.mod)
                s = 256
                q = torch.empty(2, s, h, d, dtype=bf, device="cuda")
                aux_v = pair.make_aux(_mods.ModShape(2, h, s, s))
                aux = [torch.empty(x.shape, dtype=getattr(torch, str(x.dtype)), device="cuda") for x in aux_v]
                kw = pair.kw_fa4(aux, aux_v.scalars, aux_v.constants)
                if case.kind == "mod_fwd":
                    kw.pop("score_mod_bwd", None)
                    f = ad.forward(q, torch.empty_like(q), torch.empty_like(q), **kw)
                    rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                    rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
                else:
                    lse = torch.empty(2, h, s, dtype=torch.float32, device="cuda")
                    r = ad.backward(q, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q),
                                    torch.empty_like(q), lse, **kw)
                    rec["config"] = {"compile_key": r.config.compile_key, "extra": r.config.extra}
                    rec["shapes"] = {"dq": list(r.dq.shape)}
            elif case.kind == "combine":
                op = torch.empty(case.num_splits, 2, sq, h, d, dtype=bf, device="cuda")
                lp = torch.empty(case.num_splits, 2, h, sq, dtype=torch.float32, device="cuda").transpose(-1, -2)
                out, lse, cfg = ad.combine(op, lp, out_dtype=bf)
                rec["config"] = {"compile_key": cfg["compile_key"]}
                rec["shapes"] = {"out": list(out.shape), "lse": list(lse.shape)}
            elif case.kind in _NHEADS_KINDS:
                _mla_case(case, rec)
            elif case.kind == "fp8_fwd":
                e4 = torch.float8_e4m3fn
                q = torch.empty(2, sq, h, d, dtype=e4, device="cuda")
                k = torch.empty(2, sk, h, d, dtype=e4, device="cuda")
                desc = [torch.empty(2, h, dtype=torch.float32, device="cuda") for _ in range(3)]
                f = ad.forward(q, k, torch.empty_like(k), q_descale=desc[0], k_descale=desc[1],
                               v_descale=desc[2])
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra,
                                 "entry": f.config.entry}
                rec["shapes"] = {"out": list(f.out.shape), "out_dtype": str(f.out.dtype), "lse": list(f.lse.shape)}
            elif case.kind == "seqused_fwd":
                k = torch.empty(2, sk, h, d, dtype=bf, device="cuda")
                used = torch.empty(2, dtype=torch.int32, device="cuda")
                f = ad.forward(q, k, torch.empty_like(k), seqused_k=used)
                rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra}
                rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape)}
            elif case.kind == "seqused_bwd":
                k = torch.empty(2, sk, h, d, dtype=bf, device="cuda")
                v = torch.empty_like(k)
                o, do = torch.empty_like(q), torch.empty_like(q)
                lse = torch.empty(2, h, sq, dtype=torch.float32, device="cuda")
                used = torch.empty(2, dtype=torch.int32, device="cuda")
                r = ad.backward(q, k, v, o, do, lse, seqused_k=used)
                rec["config"] = {"compile_key": r.config.compile_key, "extra": r.config.extra}
                rec["shapes"] = {"dq": list(r.dq.shape), "dk": list(r.dk.shape)}
            else:   # sparse_bwd / dense_bwd (the same problem without block sparsity: the control)
                s = 512
                q = torch.empty(1, s, h, d, dtype=bf, device="cuda")
                k, v, o, do = (torch.empty_like(q) for _ in range(4))
                lse = torch.empty(1, h, s, dtype=torch.float32, device="cuda")
                bs = None
                if case.kind == "sparse_bwd":
                    # SM100's backward tiles are 128 x 128 (interface._flash_attn_bwd); SM90's
                    # depend on the head dim (_tile_size_bwd_sm90)
                    from fa4verify.kernels.facts import arch_of_ptx_target, is_sm100_family
                    sm100 = is_sm100_family(arch_of_ptx_target(rec["arch"])) if rec["arch"] else False
                    bq, bk = (128, 128) if sm100 else ad.sm90_bwd_sparse_block_size(d)
                    bm = np.ones((-(-s // bq), -(-s // bk)), bool)
                    bs = ad.block_sparse_tensors(bm, batch=1, nheads=h, block_size=(bq, bk), direction="bwd")
                r = ad.backward(q, k, v, o, do, lse, block_sparse_tensors=bs)
                rec["config"] = {"compile_key": r.config.compile_key, "extra": r.config.extra,
                                 "bwd_config": ad.sm90_bwd_config(d, sparse=bs is not None)}
                rec["shapes"] = {"dq": list(r.dq.shape)}
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - FA4 refusing a feature is a result
        rec["error"] = f"{type(e).__name__}: {e}"[:1500]
    rec["seconds"] = round(time.time() - t0, 2)
    after = {p.name: p.stat().st_mtime_ns for p in dump.iterdir()}
    rec["kernels"] = sorted({kernel_class(n) or n[:80] for n, m in after.items()
                             if n.endswith(".ptx") and before.get(n) != m})
    return rec


def _mla_case(case: FeatureCase, rec: dict[str, Any]) -> None:
    """MLA (qv) forward, top-k gather forward, and the sparse MLA backward (saved P, or P
    recomputed in-kernel: ``gather_bwd_rp``), under FakeTensorMode: q (b, s, h, 64), k (b, sk, 1,
    64), v the latent cache (b, sk, 1, 512), qv (b, s, h, 512); gather: one index row of
    GATHER_TOPK slots per query token."""
    import torch

    from fa4verify.kernels import adapter as ad
    bf = torch.bfloat16
    h, sq, sk = case.nheads, case.seqlen_q, case.seqlen_k
    b = 2 if case.kind == "mla_fwd" else 1
    q = torch.empty(b, sq, h, MLA_HEAD_DIM, dtype=bf, device="cuda")
    qv = torch.empty(b, sq, h, MLA_HEAD_DIM_V, dtype=bf, device="cuda")
    k = torch.empty(b, sk, 1, MLA_HEAD_DIM, dtype=bf, device="cuda")
    v = torch.empty(b, sk, 1, MLA_HEAD_DIM_V, dtype=bf, device="cuda")
    idx = None if case.kind == "mla_fwd" else torch.empty(b, sq, GATHER_TOPK, dtype=torch.int32, device="cuda")
    bwd = case.kind in ("gather_bwd", "gather_bwd_rp")
    rp = case.kind == "gather_bwd_rp"
    rec["stage"] = "forward"       # where a refusal came from (a backward case runs the forward first)
    try:
        f = ad.mla_forward(q, k, v, qv, gather_kv_indices=idx, for_backward=bwd, gather_bwd_recompute_p=rp)
    except AssertionError as e:
        if not bwd:
            raise
        # the forward is refused (SM90): ask the backward itself, with stand-in forward outputs
        rec["forward_error"] = f"{type(e).__name__}: {e}"[:500]
        rec["stage"] = "backward"
        out = torch.empty(b, sq, h, MLA_HEAD_DIM_V, dtype=bf, device="cuda")
        lse = torch.empty(b, sq, h, dtype=torch.float32, device="cuda")
        p = None if rp else torch.empty(b, sq, h, GATHER_TOPK, dtype=bf, device="cuda")
        rm = None if rp else torch.empty(b, sq, GATHER_TOPK // 128, h, dtype=torch.float32, device="cuda")
        ad.mla_backward(q, k, v, qv, out, torch.empty_like(out), lse, idx, p=p, row_max=rm, recompute_p=rp)
        raise
    rec["config"] = {"compile_key": f.config.compile_key, "extra": f.config.extra,
                     "softmax_scale": f.config.softmax_scale}
    rec["shapes"] = {"out": list(f.out.shape), "lse": list(f.lse.shape),
                     "p": list(f.p.shape) if f.p is not None else None}
    if bwd:
        rec["stage"] = "backward"
        r = ad.mla_backward(q, k, v, qv, f.out, torch.empty_like(f.out), f.lse, idx, fwd=f, recompute_p=rp)
        rec["config"]["backward"] = {"compile_key": r.config.compile_key, "extra": r.config.extra}
        rec["shapes"].update(dq=list(r.dq.shape), dk=list(r.dk.shape), dv=list(r.dv.shape),
                             dqv=list(r.dqv.shape))


def _worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    from fa4verify.compile.census import _install_cpu_shims
    _install_cpu_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
    dump = Path(os.environ["CUTE_DSL_DUMP_DIR"])
    results = []
    for c in spec["cases"]:
        results.append(_one(FeatureCase(**c), dump))
        Path(spec["result"]).write_text(json.dumps(results, default=str))


def run(arch: str, cases: Sequence[FeatureCase], workdir: str | os.PathLike | None = None,
        timeout: float = 1200.0) -> dict[str, Any]:
    """Compile ``cases`` for ``arch`` ("sm_90a" | "sm_100a"); returns ``{"arch", "where":
    "compile-only", "wall_seconds", "results": [...]}``. A case that kills the compiler process
    (the DSL aborts on some layouts instead of raising) is recorded with ``aborted: True``, its
    exit status and the stderr tail, and the remaining cases run in a fresh subprocess."""
    from fa4verify.compile.census import compile_env
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fa4feat-"))
    dump = (base / f"{arch}-dump").resolve()
    dump.mkdir(parents=True, exist_ok=True)
    result = dump / "_results.json"
    env = compile_env(arch, dump, base / "dsl-cache", keep="ptx")
    t0 = time.time()
    todo = list(cases)
    results: list[dict[str, Any]] = []
    while todo:
        if result.exists():
            result.unlink()
        spec = json.dumps({"cases": [asdict(c) for c in todo], "result": str(result)})
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                            "import sys; from fa4verify.compile.features import _worker; _worker(sys.argv[1])", spec],
                           env=env, capture_output=True, text=True, timeout=timeout)
        done = json.loads(result.read_text()) if result.exists() else []
        results.extend(done)
        todo = todo[len(done):]
        if todo and r.returncode == 0:
            raise RuntimeError(f"compile subprocess for {arch} exited 0 after {len(done)} cases")
        if todo:      # the next case killed the process
            c = todo.pop(0)
            lines = r.stderr.splitlines()
            # faulthandler's stack: the innermost FA4 frames say where the DSL gave up
            tail = [ln.strip() for ln in lines if "flash_attn/cute/" in ln][:3] or \
                [ln for ln in lines if "Warning" not in ln and "LayoutEnum" not in ln][-6:]
            results.append({"case": asdict(c), "label": c.label(), "ok": False, "aborted": True,
                            "where": "compile-only", "arch": env.get("CUTE_DSL_ARCH"),
                            "error": f"compiler process died (exit status {r.returncode}): " + " | ".join(tail)[-800:],
                            "kernels": [], "seconds": None})
    return {"arch": arch, "where": "compile-only", "wall_seconds": round(time.time() - t0, 2),
            "results": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4verify.compile.features", description=__doc__.split("\n\n")[0])
    from fa4verify.kernels.facts import ptx_target
    ap.add_argument("--arch", choices=[ptx_target("sm90"), ptx_target("sm100")], required=True)
    ap.add_argument("--cases", required=True, help="comma list of kind[:n]: " + ", ".join(KINDS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--merge", default=None, metavar="FILE",
                    help="also merge the results into FILE (a compile_only_<arch>.json): a case with the "
                         "same label is replaced, the others kept; the run is listed under 'merged_runs'")
    ns = ap.parse_args(argv)
    try:
        cases = parse_cases(ns.cases)
    except ValueError as e:
        print(f"fa4verify.compile.features: error: {e}", file=sys.stderr)
        return 2
    if ns.merge:
        try:
            old = json.loads(Path(ns.merge).read_text())
            if old.get("arch") != ns.arch or not isinstance(old.get("results"), list):
                raise ValueError(f"arch {old.get('arch')!r} != {ns.arch!r} or no results list")
        except (OSError, ValueError) as e:
            print(f"fa4verify.compile.features: error: --merge {ns.merge}: {e}", file=sys.stderr)
            return 2
    out = run(ns.arch, cases)
    for r in out["results"]:
        print(f"{ns.arch} {r['label']}: {'compiles' if r['ok'] else 'ERROR ' + str(r['error'])[:160]} "
              f"({r['seconds']} s) {r['kernels']}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=1, default=str))
    if ns.merge:
        Path(ns.merge).write_text(json.dumps(merge(old, out), indent=1, default=str))
    return 0


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` census with ``new``'s results merged in (same label: replaced; order: old's, then
    the new labels); ``merged_runs`` lists each merged run's labels and wall seconds."""
    if old.get("arch") != new.get("arch"):
        raise ValueError(f"arch {old.get('arch')!r} != {new.get('arch')!r}")
    fresh = {r["label"]: r for r in new["results"]}
    results = [fresh.pop(r["label"], r) for r in old["results"]] + list(fresh.values())
    runs = list(old.get("merged_runs", [])) + [{"labels": [r["label"] for r in new["results"]],
                                                "wall_seconds": new.get("wall_seconds")}]
    return {**old, "results": results, "merged_runs": runs}


if __name__ == "__main__":
    raise SystemExit(main())
