"""Triage one failing case on production FA4: replay it, then replay variants that each change one
attribute (sink off, page size, head dim, batch, ...), one line per variant: the verdict of the
one judge (fwd_budget, or the property given) and, on a violation, the share of elements over
budget and the worst element. The variant that turns the failure off names the attribute the
fault needs; a fault that survives every variant is in what they all share.

    python scripts/gpu_triage_case.py --case docs/results/h200/seeds/audit_seed2_failures.json \
        [--result coverage.production] [--property fwd_budget] [--json OUT] [--target twin]

``--case`` takes a case file (``fa4verify fuzz`` writes them), an audit JSON (the failure of the
named result), this script's own ``--json`` (its case: a replay) or a bare problem JSON. ``--target twin`` replays on the CPU twin (not evidence about
FA4: a control that the variants are well formed, and what tests/test_gpu_triage_case_script.py runs).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional


def load_problem(path: Path, result: Optional[str]):
    from fa4verify.problem import AttentionProblem
    d = json.loads(path.read_text())
    if "results" in d:                                     # an audit report
        rs = [r for r in d["results"] if result is None or r["id"] == result]
        fails = [r for r in rs if r.get("details", {}).get("failure")]
        if not fails:
            raise SystemExit(f"gpu_triage_case: no result with a failure in {path} (result={result})")
        d = fails[0]["details"]["failure"]["problem"]
    elif "problem" in d:                                   # a case file
        d = d["problem"]
    elif "case" in d and "variants" in d:                  # this script's own --json (a replay)
        d = d["case"]
    return AttentionProblem.from_json(json.dumps(d))


def variants(p, head_dims=(64, 128), page_sizes=(8, 32, 64, 128)) -> list[tuple[str, Callable[[], Any]]]:
    """(label, thunk building the variant); a thunk that raises ValueError is reported 'invalid'."""
    from fa4verify.problem import CallForm
    R = dataclasses.replace
    c = p.call if p.call is not None else CallForm()
    out: list[tuple[str, Callable[[], Any]]] = [("as recorded", lambda: p)]
    if p.sink:
        out.append(("sink off", lambda: R(p, sink=False)))
    if c.paged:
        for ps in sorted(set(page_sizes) - {c.page_size}):
            out.append((f"page_size {ps}", lambda ps=ps: R(p, call=R(c, page_size=ps, full_pages=False,
                                                                    kv_capacity=-(-c.kv_capacity // ps) * ps))))
        out.append(("spare_pages 0", lambda: R(p, call=R(c, spare_pages=0))))
        out.append(("page_seed +1", lambda: R(p, call=R(c, page_seed=(c.page_seed or 0) + 1))))
        out.append(("identity pages (page_seed None)", lambda: R(p, call=R(c, page_seed=None))))
        out.append(("not paged (seqused_k only)", lambda: R(p, call=R(c, page_size=None, page_seed=None,
                                                                       spare_pages=0, full_pages=False))))
    if c.seqused_k and not c.paged:
        out.append(("seqused_k off (cu_seqlens_k)", lambda: R(p, call=R(c, seqused_k=False))))
    if c.seqused_q:
        out.append(("q_capacity +80", lambda: R(p, call=R(c, q_capacity=c.q_capacity + 80))))
        out.append((f"q_packed {not c.q_packed}", lambda: R(p, call=R(c, q_packed=not c.q_packed))))
        out.append(("seqused_q off (cu_seqlens_q)", lambda: R(p, call=R(c, seqused_q=False, q_capacity=0,
                                                                         q_packed=False))))
    if c.seqused_k and p.seqlens_q is not None and len(set(p.seqlens_q)) > 1 and not c.q_batched:
        m = max(p.seqlens_q)
        out.append(("q batched (equal seqlens_q)", lambda: R(p, seqlens_q=(m,) * p.batch, seqlen_q=m,
                                                              call=R(c, q_batched=True))))
    if p.batch > 1 and p.seqlens_q is not None:
        for i in range(p.batch):
            out.append((f"only sequence {i}", lambda i=i: R(p, batch=1, seqlens_q=(p.seqlens_q[i],),
                                                             seqlens_k=(p.seqlens_k[i],),
                                                             seqlen_q=p.seqlens_q[i], seqlen_k=p.seqlens_k[i])))
    if p.head_dim != p.head_dim_v:
        out.append((f"head_dim_v {p.head_dim}", lambda: R(p, head_dim_v=p.head_dim)))
        out.append((f"head_dim {p.head_dim_v}", lambda: R(p, head_dim=p.head_dim_v)))
    for hd in sorted(set(head_dims) - {p.head_dim}):
        out.append((f"head_dim {hd}", lambda hd=hd: R(p, head_dim=hd, head_dim_v=hd)))
    if not p.causal:
        out.append(("causal", lambda: R(p, causal=True)))
    if p.window_size == (None, None):
        out.append(("window (64, 0)", lambda: R(p, window_size=(64, 0))))
    if p.nheads > 1:
        out.append(("nheads 1", lambda: R(p, nheads=1, nheads_kv=1)))
    if p.softcap:
        out.append(("softcap off", lambda: R(p, softcap=0.0)))
    if c.pack_gqa is not None:
        out.append(("pack_gqa default", lambda: R(p, call=R(c, pack_gqa=None))))
    if c.block_size is not None:
        out.append(("block sparsity off", lambda: R(p, call=R(c, block_size=None, block_seed=None))))
        out.append(("block_keep 1.0", lambda: R(p, call=R(c, block_keep=1.0))))
    if p.values.distribution != "normal":
        from fa4verify.problem import ValueSpec
        out.append(("values normal", lambda: R(p, values=ValueSpec("normal", p.values.seed))))
    out.append(("values seed +1", lambda: R(p, values=R(p.values, seed=p.values.seed + 1))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", type=Path, required=True)
    ap.add_argument("--result", default="coverage.production", help="the result of an audit JSON to take")
    ap.add_argument("--property", default="fwd_budget")
    ap.add_argument("--target", choices=("production", "twin"), default="production")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--head-dims", default="64,128", help="head dims of the head-dim variants")
    ap.add_argument("--page-sizes", default="8,32,64,128", help="page sizes of the page-size variants")
    ap.add_argument("--only", default="", help="comma-separated prefixes: run only the variants whose label starts "
                                               "with one of them ('as recorded' always runs)")
    ap.add_argument("--deterministic", choices=("on", "off"), default="on",
                    help="the backward's mode of the case (a plan row's det); one variant runs the other")
    a = ap.parse_args()
    from fa4verify.fuzz import check_problem
    from fa4verify.targets import make_target
    from fa4verify.errors import Unsupported
    from fa4verify.fuzz.violation import Violation
    p = load_problem(a.case, a.result)
    target = make_target(a.target)
    where = target.describe()["where"]
    print(f"# {where}; property {a.property}; case {p.describe()}", flush=True)
    rows = []
    ints = lambda x: tuple(int(v) for v in x.split(",") if v)   # noqa: E731
    det = a.deterministic == "on"
    flip = f"deterministic {'off' if det else 'on'}"
    chosen = variants(p, ints(a.head_dims), ints(a.page_sizes)) + [(flip, lambda: p)]
    only = tuple(x.strip() for x in a.only.split(",") if x.strip())
    if only:
        chosen = [(lb, b) for lb, b in chosen if lb == "as recorded" or lb.startswith(only)]
    for label, build in chosen:
        t0 = time.monotonic()
        try:
            q = build()
            if q.call is not None:
                q.call.validate(q)
        except ValueError as e:
            rows.append({"variant": label, "outcome": "invalid", "detail": str(e)})
            print(f"{label:36s} invalid: {e}", flush=True)
            continue
        try:
            out = check_problem(q, target, properties=("runs", a.property),
                                deterministic=(not det) if label == flip else det)
            outcome = "undecided" if out.undecided else ("pass" if a.property in out.ran else "skipped")
            detail = "; ".join(f"{k}: {v}" for k, v in (out.undecided or out.skipped).items()) or \
                f"tightness {out.metrics.get('tightness_max', float('nan')):.3g}"
        except Violation as v:
            outcome, detail = "FAIL", v.message.split(" | case:")[0][:300]
            idx = getattr(v, "over_indices", None)
            if idx is not None and len(idx) and q.varlen and str(v.metrics.get("quantity")) == "dq":
                # the (token, head) rows over budget, as (head, sequence, row in it)
                toks = sorted({(int(h), int(t)) for t, h in ((i[0], i[1]) for i in idx)})
                cu = [0]
                for n in q.seqlens_q:
                    cu.append(cu[-1] + n)
                def seq_row(t):
                    b = max(i for i in range(len(cu) - 1) if cu[i] <= t)
                    return b, t - cu[b]
                rows_over = [(h,) + seq_row(t) for h, t in toks]
                detail += f"; {len(rows_over)} (head, sequence, row) over: {rows_over[:48]}"
        except Unsupported as e:
            outcome, detail = "unsupported", str(e)[:200]
        except Exception as e:  # noqa: BLE001 - a variant's error is a line of the table, not the end
            outcome, detail = "error", f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc(limit=3)
        dt = time.monotonic() - t0
        rows.append({"variant": label, "outcome": outcome, "detail": detail, "problem": q.to_dict(),
                     "seconds": round(dt, 1)})
        print(f"{label:36s} {outcome:9s} {dt:5.1f}s  {detail}", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"where": where, "property": a.property, "case": p.to_dict(),
                                      "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
