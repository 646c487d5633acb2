"""score_mod / mask_mod pairs on an SM90 GPU (issue 16 item 1): every registered pair of
``fa4verify.mods`` through FA4's forward and backward, judged against the float64 mod oracle under
the composed budgets (O, LSE, dQ, dK, dV), plus the pairs that equal an FA4 built-in run both ways:

* ``softcap`` (score_mod) vs ``softcap=30`` -- expected **bitwise** equal, forward and backward
  (FA4 turns ``softcap`` into the same score_mod: ``utils.create_softcap_scoremod``);
* ``sliding_window`` (mask_mod, (128, 0)) vs ``window_size=(128, 0)`` and ``causal`` (mask_mod)
  vs ``causal=True`` -- the same keep set; expected bitwise in the forward at hd 128 (same tiles;
  the mask_mod path visits extra fully masked tiles, exact zeros), the contract judged is the
  budget; the backward tiles may differ (reported, not assumed).

Jobs run in ``--workers`` subprocesses (each compiles its own FA4 kernels: the compile is
single-threaded CPU work; a DSL abort kills one worker, not the run). Output JSON (``--json``),
the shape ``fa4verify/tables/features.py`` reads from ``docs/results/features/h200/features_mods.json``.

``--device cpu`` replaces FA4 by a CPU stand-in (the float64 oracle rounded to bf16) with small
sizes, so ``tests/test_gpu_mods_script.py`` runs every line without a GPU; such output says "CPU
stand-in" and is not evidence. Run on the H200: ``bash scripts/gpu/mods.sh`` (~1.5-2.5 min).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np

#: pair name -> the FA4 built-in call it equals (adapter keyword arguments)
BUILTIN = {"softcap": lambda p: {"softcap": p.equivalent["softcap"]},
           "sliding_window": lambda p: {"window_size": tuple(p.equivalent["window_size"])},
           "causal": lambda p: {"causal": True}}
#: score pairs also run with causal=True (FA4 keeps causal with a score_mod)
CAUSAL_TOO = ("alibi",)


def _shape(small: bool):
    return (1, 256, 2, 64) if small else (2, 1024, 4, 128)


def jobs(names) -> list[dict[str, Any]]:
    from fa4verify import mods
    out = []
    for n in names:
        p = mods.get(n)
        out.append({"pair": n, "causal": False})
        if p.kind == "score" and n in CAUSAL_TOO:
            out.append({"pair": n, "causal": True})
    return out


def balance(todo: list[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    """Jobs into ``n`` worker groups, longest first onto the least loaded (a job with a built-in
    comparison compiles twice: cost 2)."""
    cost = lambda j: 2 if j["pair"] in BUILTIN and not j["causal"] else 1  # noqa: E731
    groups: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    load = [0] * n
    for j in sorted(todo, key=cost, reverse=True):
        i = load.index(min(load))
        groups[i].append(j)
        load[i] += cost(j)
    return [g for g in groups if g]


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------

class Fa4:
    device = "cuda"

    def __init__(self):
        from fa4verify.kernels import adapter
        from fa4verify.kernels.device import local_gpu, where_measured
        self.ad = adapter
        self.where = where_measured(local_gpu())
        self.versions = adapter.versions()

    def run(self, q, k, v, do, pair, aux, causal, builtin=None, problem=None, arrays=None):
        import torch
        aux_t = [torch.from_numpy(x).cuda() for x in aux]
        kw = dict(builtin) if builtin else pair.kw_fa4(aux_t, getattr(aux, "scalars", ()))
        fkw = {n: x for n, x in kw.items() if n != "score_mod_bwd"}
        if causal:
            fkw["causal"] = kw["causal"] = True
        f = self.ad.forward(q, k, v, return_lse=True, **fkw)
        torch.cuda.synchronize()
        b = self.ad.backward(q, k, v, f.out, do, f.lse, **kw)
        torch.cuda.synchronize()
        return f.out, f.lse, b.dq, b.dk, b.dv, {"fwd": f.config.to_dict(), "bwd": b.config.to_dict()}


class CpuStandIn:
    """Same surface as :class:`Fa4`: the float64 mod oracle rounded to bf16 (not evidence)."""
    device = "cpu"
    where = "CPU stand-in (not evidence)"
    versions: dict = {}

    def run(self, q, k, v, do, pair, aux, causal, builtin=None, problem=None, arrays=None):
        import torch
        from fa4verify.judge.attention import oracle_backward
        r = oracle_backward(problem, arrays)
        bf = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16)  # noqa: E731
        return (bf(r.forward.out), torch.from_numpy(r.forward.lse.astype(np.float32)), bf(r.dq), bf(r.dk), bf(r.dv),
                {"stand_in": True})


# ---------------------------------------------------------------------------------------------
# one job
# ---------------------------------------------------------------------------------------------

def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def _bitwise(a, b) -> bool:
    import torch
    a, b = a.cpu(), b.cpu()
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    return bool(torch.equal(a, b))


def _verdict(v) -> dict[str, Any]:
    return {"status": v.status, "tightness": v.tightness, "n_compared": v.n_compared, "n_over": v.n_over,
            "summary": v.summary()}


def run_job(K, job: dict[str, Any], small: bool) -> dict[str, Any]:
    import torch
    from fa4verify import mods
    from fa4verify.judge import judge_backward, judge_forward
    from fa4verify.problem import AttentionProblem
    from fa4verify.judge.attention import oracle_backward
    from fa4verify.judge.verdict import compare
    name, causal = job["pair"], job["causal"]
    pair = mods.get(name)
    b, s, h, d = _shape(small)
    prob = AttentionProblem(arch="sm90", dtype="bf16", batch=b, seqlen_q=s, seqlen_k=s, nheads=h, nheads_kv=h,
                            head_dim=d, head_dim_v=d, causal=causal, mods=(name,))
    aux = pair.make_aux(mods.ModShape(b, h, s, s), seed=0)
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(b, s, h, d, generator=gen).to(torch.bfloat16) for _ in range(4))
    if name == "softcap":
        q = (q.float() * 6).to(torch.bfloat16)        # scores reach the cap (|x| up to ~60)
    a = {"q": _np(q), "k": _np(k), "v": _np(v), "dout": _np(do), "learnable_sink": None, "mask": None,
         "cu_seqlens_q": None, "cu_seqlens_k": None, "mod_aux": {name: aux}}
    row: dict[str, Any] = {"pair": name, "kind": pair.kind, "causal": causal, "features": list(pair.features),
                           "shape": {"batch": b, "seqlen": s, "nheads": h, "head_dim": d}}
    t0 = time.time()
    dev = K.device
    args = tuple(x.to(dev) for x in (q, k, v, do))
    try:
        out, lse, dq, dk, dv, cfg = K.run(*args, pair, aux, causal, problem=prob, arrays=a)
    except Exception as e:  # noqa: BLE001 - FA4 refusing is a result
        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        row["seconds"] = time.time() - t0
        return row
    row["kernel_seconds"] = time.time() - t0
    row["config"] = cfg
    obwd = oracle_backward(prob, a)
    jf = judge_forward(prob, a, _np(out), _np(lse), oracle=obwd.forward)
    jb = judge_backward(prob, a, _np(dq), _np(dk), _np(dv), forward=jf, oracle_bwd=obwd, probabilistic=False)
    row.update(out=_verdict(jf.out), lse=_verdict(jf.lse), dq=_verdict(jb.dq), dk=_verdict(jb.dk),
               dv=_verdict(jb.dv))
    judged = [row[n] for n in ("out", "lse", "dq", "dk", "dv")]
    row["max_tightness"] = max(x["tightness"] for x in judged)
    row["within_budget"] = all(x["status"] == "pass" for x in judged)
    if name in BUILTIN and not causal:
        bi = BUILTIN[name](pair)
        cmp: dict[str, Any] = {"builtin": {kk: list(vv) if isinstance(vv, tuple) else vv for kk, vv in bi.items()}}
        try:
            bo, bl, bdq, bdk, bdv, bcfg = K.run(*args, pair, aux, False, builtin=bi, problem=prob, arrays=a)
        except Exception as e:  # noqa: BLE001
            cmp["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        else:
            mine = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
            theirs = {"out": bo, "lse": bl, "dq": bdq, "dk": bdk, "dv": bdv}
            cmp["bitwise"] = {n: _bitwise(mine[n], theirs[n]) for n in mine}
            cmp["max_abs_diff"] = {n: float((mine[n].float().cpu() - theirs[n].float().cpu()).abs().max())
                                   for n in mine}
            # the built-in's outputs under the same oracle and budgets
            refs = {"out": jf.ref_out, "lse": jf.ref_lse}
            vb = {n: compare(n, _np(theirs[n]), refs[n].value, oracle_bound=refs[n].bound, budget=refs[n].budget)
                  for n in ("out", "lse")}
            for n in ("dq", "dk", "dv"):
                vb[n] = compare(n, _np(theirs[n]), getattr(obwd, n), oracle_bound=getattr(obwd, f"{n}_bound"),
                                budget=jb.budgets[n])
            cmp["builtin_verdicts"] = {n: _verdict(x) for n, x in vb.items()}
            cmp["builtin_within_budget"] = all(x.status == "pass" for x in vb.values())
            cmp["config"] = bcfg
        row["vs_builtin"] = cmp
    row["seconds"] = time.time() - t0
    return row


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------

def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]

    def part(dirs):
        xs = [r[n] for r in ok for n in dirs]
        return {"n_runs": len(ok), "max_tightness": max((x["tightness"] for x in xs), default=None),
                "all_within_budget": bool(ok) and len(ok) == len(rows) and all(x["status"] == "pass" for x in xs)}
    eq = {r["pair"]: {kk: r["vs_builtin"].get(kk) for kk in ("bitwise", "max_abs_diff", "builtin_within_budget",
                                                              "error", "builtin")}
          for r in rows if "vs_builtin" in r}
    return {"rows": rows, "fwd": part(("out", "lse")), "bwd": part(("dq", "dk", "dv")),
            "pairs": sorted({r["pair"] for r in rows}), "errors": [f"{r['pair']}: {r['error']}" for r in rows
                                                                   if "error" in r],
            "vs_builtin": eq,
            "max_tightness": max((r["max_tightness"] for r in ok), default=None),
            "all_within_budget": bool(rows) and all(r.get("within_budget") for r in rows)}


def _worker_main(ns) -> int:
    K = Fa4() if ns.device == "cuda" else CpuStandIn()
    js = json.loads(ns.jobs)
    rows = []
    for job in js:
        print(f"[mods] {job['pair']} causal={job['causal']}", flush=True)
        try:
            rows.append(run_job(K, job, ns.small))
        except Exception as e:  # noqa: BLE001
            rows.append({"pair": job["pair"], "causal": job["causal"], "error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()[-2000:]})
        with open(ns.json, "w") as f:        # after each job: a dying worker leaves its finished rows
            json.dump({"rows": rows, "where": K.where, "versions": K.versions}, f, default=str)
        r = rows[-1]
        print(json.dumps({kk: r.get(kk) for kk in ("pair", "causal", "max_tightness", "within_budget", "error")}),
              flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="small sizes (implied by --device cpu)")
    ap.add_argument("--pairs", default="", help="comma list of registered pairs (default: all)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--worker-timeout", type=int, default=400)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--jobs", default="[]", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    ns.small = ns.small or ns.device == "cpu"
    if ns.worker:
        return _worker_main(ns)
    from fa4verify import mods
    names = [x.strip() for x in ns.pairs.split(",") if x.strip()] or mods.names()
    unknown = [n for n in names if n not in mods.names()]
    if unknown or ns.workers < 1:
        print(f"gpu_mods: error: {'unknown pairs ' + ', '.join(unknown) if unknown else '--workers must be >= 1'}",
              file=sys.stderr)
        return 2
    todo = jobs(names)
    nw = min(ns.workers, len(todo))
    groups = balance(todo, nw)
    t0 = time.time()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 4) // nw)))
    env.setdefault("OPENBLAS_NUM_THREADS", env["OMP_NUM_THREADS"])
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    rows: list[dict[str, Any]] = []
    where, versions = ("CPU stand-in (not evidence)" if ns.device == "cpu" else None), {}
    with tempfile.TemporaryDirectory() as td:
        procs = []
        for i, g in enumerate(groups):
            out = os.path.join(td, f"w{i}.json")
            cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--worker", "--json", out,
                   "--device", ns.device, "--jobs", json.dumps(g)] + (["--small"] if ns.small else [])
            procs.append((g, out, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   text=True)))
        for g, out, p in procs:
            try:
                log, _ = p.communicate(timeout=max(1, ns.worker_timeout - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                log, _ = p.communicate()
                log += f"\n[mods] worker timed out after {ns.worker_timeout} s"
            sys.stdout.write(log)
            done = []
            if os.path.exists(out):
                with open(out) as f:
                    d = json.load(f)
                done = d["rows"]
                where, versions = d.get("where", where), d.get("versions", versions)
            rows.extend(done)
            for job in g[len(done):]:
                tail = " | ".join([ln for ln in log.splitlines() if ln.strip()][-3:])[-500:]
                rows.append({"pair": job["pair"], "causal": job["causal"],
                             "error": f"worker died or timed out (exit status {p.returncode}): {tail}"})
    res = summarize(rows)
    res["seconds"] = time.time() - t0
    doc = {"section": "mods", "where": where or "?", "versions": versions, "result": res,
           "command": "python scripts/gpu_mods.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    with open(ns.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"[mods] {doc['where']}: fwd {res['fwd']}, bwd {res['bwd']}, vs built-in "
          + json.dumps({kk: (vv or {}).get("bitwise") for kk, vv in res["vs_builtin"].items()})
          + (f", errors {res['errors']}" if res["errors"] else "") + f" ({res['seconds']:.0f} s)", flush=True)
    return 0 if not res["errors"] else 3


if __name__ == "__main__":
    raise SystemExit(main())
