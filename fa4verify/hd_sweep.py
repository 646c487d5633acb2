"""Head-dim sweep of FA4's backward: dQ, dK, dV relative errors against the exact float64 gradient.

Used by ``scripts/gpu_hd_sweep.py`` (recording), the audit checks ``production.head_dims``
(recorded data) and ``production.head_dims_live`` (on a GPU).  One row per (head dim, seqlen_q):
``{"head_dim", "seqlen_q", "seqlen_k", "causal", "dq_rel_err", "dk_rel_err", "dv_rel_err"}`` or,
when the call raises, ``{"head_dim", ..., "error": "<type>: <message>", "blame": "fa4" | "fa4verify"}``
(Note [Blame], :mod:`fa4verify.blame`: only a row FA4 raised in says the backward raises; a row
fa4verify's own call failed on is fa4verify's error; a recorded row without ``blame`` was FA4's).

Criterion (:func:`dq_ratio`): dQ's relative error divided by ``DQ_RATIO_LIMIT`` times the larger
of dK's and dV's relative error of the same run.  dK and dV come from the same bf16 algorithm, so
they calibrate the noise level; a ratio above 1 means dQ is wrong, not noisy (on the H200, a
healthy head dim has ratio ~0.25, the defective ones 30-120).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

DQ_RATIO_LIMIT = 4.0


def reference_grads(q, k, v, do, scale: float, causal: bool):
    """Exact gradients of softmax(q k^T * scale) v (bottom-right causal) in float64, on the
    tensors' device."""
    import torch
    qq, kk, vv = (t.double().detach().clone().requires_grad_(True) for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv).backward(do.double())
    return qq.grad, kk.grad, vv.grad


def measure(adapter: Any, head_dim: int, seqlen_q: int, seqlen_k: int, *, causal: bool = False,
            generator=None, device: str = "cuda", nheads: int = 2) -> dict[str, Any]:
    """Run FA4's forward and deterministic backward through ``adapter`` on N(0,1) bf16 inputs
    (drawn on the CPU from ``generator``) and return one sweep row."""
    import torch
    g = generator if generator is not None else torch.Generator(device="cpu").manual_seed(0)
    q, do = (torch.randn(1, seqlen_q, nheads, head_dim, generator=g).to(device, torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, seqlen_k, nheads, head_dim, generator=g).to(device, torch.bfloat16) for _ in range(2))
    row: dict[str, Any] = {"head_dim": head_dim, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "causal": causal}
    try:
        f = adapter.forward(q, k, v, causal=causal, return_lse=True)
        b = adapter.backward(q, k, v, f.out, do, f.lse, causal=causal, deterministic=True)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - an accepted head dim FA4 cannot run is a result
        from fa4verify import blame
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["blame"] = blame.origin(e)
        return row
    refs = reference_grads(q, k, v, do, 1.0 / math.sqrt(head_dim), causal)
    for name, got, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), refs):
        row[f"{name}_rel_err"] = float((got.double() - ref).norm() / ref.norm())
    return row


def dq_ratio(row: dict[str, Any]) -> Optional[float]:
    """dQ error over ``DQ_RATIO_LIMIT`` x max(dK, dV) error; None for a row where FA4 raised."""
    if "error" in row:
        return None
    return row["dq_rel_err"] / (DQ_RATIO_LIMIT * max(row["dk_rel_err"], row["dv_rel_err"], 1e-300))


def tag(row: dict[str, Any]) -> str:
    return f"hd{row['head_dim']} sq{row['seqlen_q']}{' causal' if row.get('causal') else ''}"


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``{"wrong": [tags], "raised": [tags], "errored": [tags], "wrong_hds": [...], "raised_hds":
    [...], "errored_hds": [...], "worst": r, "table": [[tag, outcome, dq, dk, dv], ...]}``;
    ``raised``: FA4 raised; ``errored``: fa4verify's own call failed (Note [Blame])."""
    out: dict[str, Any] = {"wrong": [], "raised": [], "errored": [], "worst": 0.0, "table": []}
    wrong_hds, raised_hds, errored_hds = set(), set(), set()
    for r in rows:
        ratio = dq_ratio(r)
        if ratio is None and r.get("blame") == "fa4verify":
            out["errored"].append(tag(r))
            errored_hds.add(r["head_dim"])
            out["table"].append([tag(r), "fa4verify error", r["error"][:80], "", ""])
            continue
        if ratio is None:
            out["raised"].append(tag(r))
            raised_hds.add(r["head_dim"])
            out["table"].append([tag(r), "raised", r["error"][:80], "", ""])
            continue
        out["worst"] = max(out["worst"], ratio)
        bad = ratio > 1
        if bad:
            out["wrong"].append(tag(r))
            wrong_hds.add(r["head_dim"])
        out["table"].append([tag(r), "wrong dQ" if bad else "ok", r["dq_rel_err"], r["dk_rel_err"], r["dv_rel_err"]])
    out["wrong_hds"], out["raised_hds"] = sorted(wrong_hds), sorted(raised_hds)
    out["errored_hds"] = sorted(errored_hds)
    return out
