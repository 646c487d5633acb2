"""Audit check ``production.long_context`` (profile ``long`` only): production FA4 forward and
backward at long context (default seqlen 32768 and 131072, 1 x 8 heads x hd 128, causal, bf16)
judged by the one judge core against the streamed float64 oracle
(:func:`fa4verify.judge.long_context.judge_long_context`) within the composed budgets.

``fa4verify audit --profile long --device cuda`` runs it (the default audit does not: 128k
took 126.7 s of H200 time with the host engine in session 4; the device engine, default since
session 5, is expected at ~30-35 s). Its evidence has the seconds of every phase
(:data:`PHASES`, ``details["phase_seconds"]``) and the tightness histograms
(``details["tightness_histogram"]``). ``FA4VERIFY_LONG_SEQLENS`` (comma-separated, default
``32768,131072``) and ``FA4VERIFY_LONG_ROW_STRIDE`` (default 1: every row judged) scale it.

:func:`run_case` is shared with ``benchmarks/gpu_long_context.py``; ``kernel="torch32"`` is a
CPU stand-in (float32 torch attention with outputs rounded to the input dtype) so the entry
points run in the CPU tests.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

from fa4verify.checks import _live
from fa4verify.audit.registry import CheckContext, CheckResult, check

ENV_SEQLENS = "FA4VERIFY_LONG_SEQLENS"
ENV_STRIDE = "FA4VERIFY_LONG_ROW_STRIDE"


def _sync(device) -> None:
    import torch
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _torch32(q, k, v, dout, causal: bool):
    """CPU stand-in kernel: float32 attention (autograd), outputs rounded to the input dtype."""
    import torch
    qq, kk, vv = (x.float().permute(0, 2, 1, 3).detach().requires_grad_() for x in (q, k, v))
    g = qq.shape[1] // kk.shape[1]
    ke, ve = (x.repeat_interleave(g, dim=1) if g > 1 else x for x in (kk, vv))
    s = qq @ ke.transpose(-1, -2) / (q.shape[-1] ** 0.5)
    sq, sk = s.shape[-2:]
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ ve
    o.backward(dout.float().permute(0, 2, 1, 3))
    dt = q.dtype
    back = lambda x: x.permute(0, 2, 1, 3).to(dt)   # noqa: E731
    return back(o.detach()), lse.detach(), back(qq.grad), back(kk.grad), back(vv.grad)


def run_case(seqlen: int, *, nheads: int = 8, nheads_kv: int = 8, head_dim: int = 128, causal: bool = True,
             dtype: str = "bf16", device: str = "cuda", kernel: str = "fa4", seed: int = 0,
             block: int = 4096, block_k: Optional[int] = None, row_stride: int = 1,
             backward: bool = True, arch: Optional[str] = None, engine: str = "device",
             chunk: int = 16384, cross_check: bool = False, plant: bool = False) -> dict[str, Any]:
    """Run one long-context case and judge it; returns the judgement, kernel seconds and arch.

    ``engine="device"`` (default): the kernel outputs stay on the device and the budgets and
    the comparison run there (Note [Device engine] in :mod:`fa4verify.judge.long_context_device`);
    ``"host"``: the numpy path (outputs copied to the host). ``cross_check``: the same kernel
    outputs are judged by the other engine too (``result["other"]``, its judgement). ``plant``:
    one element of ``out`` (+1) and of ``dq`` (+10) is corrupted after the kernels ran
    (``result["planted"]``: their indices), so the verdicts must be fail there."""
    import numpy as np
    import torch

    from fa4verify.judge.attention import dense_problem
    from fa4verify.judge.long_context import judge_long_context
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shp_q, shp_k = (1, seqlen, nheads, head_dim), (1, seqlen, nheads_kv, head_dim)
    q = torch.randn(shp_q, generator=gen).to(tdt).to(device)
    k = torch.randn(shp_k, generator=gen).to(tdt).to(device)
    v = torch.randn(shp_k, generator=gen).to(tdt).to(device)
    dout = torch.randn(shp_q, generator=gen).to(tdt).to(device) if backward else None
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    if kernel == "fa4":
        from fa4verify.kernels import adapter
        f = adapter.forward(q, k, v, causal=causal)
        out, lse = f.out, f.lse
        _sync(device)
        secs["kernel_forward"] = time.perf_counter() - t0
        dq = dk = dv = None
        if backward:
            t1 = time.perf_counter()
            b = adapter.backward(q, k, v, out, dout, lse, causal=causal)
            dq, dk, dv = b.dq, b.dk, b.dv
            _sync(device)
            secs["kernel_backward"] = time.perf_counter() - t1
    elif kernel == "torch32":
        out, lse, dq, dk, dv = _torch32(q.cpu(), k.cpu(), v.cpu(),
                                        dout.cpu() if backward else torch.zeros(shp_q, dtype=tdt), causal)
        secs["kernel_forward_backward"] = time.perf_counter() - t0
        if not backward:
            dq = dk = dv = None
    else:
        raise ValueError(f"kernel {kernel!r}: choose fa4 or torch32")
    planted = {}
    if plant:   # faults far over any budget (|O| <~ 1, |dQ| <~ 1 here): the judge must fail them
        out = out.clone()
        planted["out"] = (0, seqlen // 2, 0, 0)
        out[planted["out"]] += 1.0
        if dq is not None:
            dq = dq.clone()
            planted["dq"] = (0, seqlen // 3, 0, 1)
            dq[planted["dq"]] += 10.0

    def judge(eng: str):
        if eng == "host":
            n = lambda x: None if x is None else x.detach().float().cpu().numpy()   # noqa: E731
        else:
            n = lambda x: None if x is None else x.detach()   # noqa: E731
        return judge_long_context(prob, q, k, v, n(out), n(lse), dout=dout, dq=n(dq), dk=n(dk), dv=n(dv),
                                  device=device, block=block, block_k=block_k, row_stride=row_stride,
                                  sync=lambda: _sync(device), engine=eng, chunk=chunk)
    if arch is None:
        from fa4verify.kernels import device as kdev
        arch = (kdev.local_gpu().arch if kernel == "fa4" else None) or "sm90"
    prob = dense_problem(np.zeros(shp_q, np.float32), np.zeros(shp_k, np.float32), np.zeros(shp_k, np.float32),
                         arch=arch, dtype=dtype, causal=causal)
    res = {"judgement": judge(engine), "kernel_seconds": secs, "arch": arch, "planted": planted}
    if cross_check:
        res["other"] = judge("host" if engine == "device" else "device")
    return res


def engine_agreement(a, b) -> dict[str, Any]:
    """How two judgements of the same outputs agree (the device vs the host engine): per
    tensor, whether status and counts are equal and the relative tightness difference."""
    out: dict[str, Any] = {}
    for n, va in a.verdicts.items():
        vb = b.verdicts.get(n)
        if vb is None:
            out[n] = {"same": False, "why": "missing"}
            continue
        same = (va.status, va.n_compared, va.n_over, va.n_unjudged) == (vb.status, vb.n_compared, vb.n_over, vb.n_unjudged)
        t = max(abs(va.tightness), abs(vb.tightness))
        out[n] = {"same": bool(same), "tightness_rel_diff": (abs(va.tightness - vb.tightness) / t) if t else 0.0,
                  "status": [va.status, vb.status]}
    out["all_same"] = all(x["same"] for x in out.values() if isinstance(x, dict))
    return out


#: the phases the long-context evidence times (kernel, oracle, budgets, comparison), in order
PHASES = ("kernel_forward", "kernel_backward", "kernel_forward_backward", "oracle_forward", "budget_forward", "compare_forward",
          "budget_derr", "oracle_backward", "budget_backward", "compare_backward", "total")


def phase_seconds(result: dict) -> dict[str, float]:
    """Seconds per phase of a :func:`run_case` result (:data:`PHASES`; ``total`` = kernels +
    judgement; the host engine's ``budget_compare_backward`` is listed as ``budget_backward``)."""
    j = result["judgement"]
    secs = {**result["kernel_seconds"], **j.seconds}
    if "budget_compare_backward" in secs:
        secs["budget_backward"] = secs.pop("budget_compare_backward")
    secs["total"] = j.seconds["total"] + sum(result["kernel_seconds"].values())
    return {n: float(secs[n]) for n in PHASES if n in secs}


def histogram_row(h: dict) -> dict[str, int]:
    """A :class:`~fa4verify.judge.verdict.StreamedCompare` histogram as labelled counts
    (``"0"``, ``"(0, 0.001]"``, ..., ``"> 1"``)."""
    e, c = h["edges"], h["counts"]
    labels = ["0"] + [f"({e[i - 1]:g}, {e[i]:g}]" for i in range(1, len(e) - 1)] + [f"> {e[-2]:g}"]
    return dict(zip(labels, (int(x) for x in c)))


def _seqlens() -> tuple[int, ...]:
    raw = os.environ.get(ENV_SEQLENS, "32768,131072")
    try:
        out = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise ValueError(f"{ENV_SEQLENS}={raw!r}: expected comma-separated positive integers")
    return out


#: the largest row stride: a sample sparser than this judges too few rows to stand for the run
#: (a stride of 10^9 judged row 0 only, and the check passed with both planted faults missed)
MAX_ROW_STRIDE = 63


def row_stride() -> int:
    """``FA4VERIFY_LONG_ROW_STRIDE``: judge every n-th query row, n = 1 (every row) or odd up to 63.
    Odd: rows 0, n, 2n, ... then meet every row position of FA4's 64-row tiles and warps (an even
    stride, e.g. 64, would judge the same in-tile row again and again)."""
    raw = os.environ.get(ENV_STRIDE, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not (1 <= n <= MAX_ROW_STRIDE and n % 2 == 1):
        raise ValueError(f"{ENV_STRIDE}={raw!r}: expected 1 (every row) or an odd integer up to {MAX_ROW_STRIDE}")
    return n


def _compiles(ctx: CheckContext) -> list:
    """Note [Fake device audit]: the long problems are not compiled on a fake device."""
    gpu = ctx.require_gpu()
    ctx.skip(f"compile-only on a fake {gpu.label}: production.long_context's problems (1 x 8 x hd128 causal "
             f"at seqlen {', '.join(map(str, _seqlens()))}) would be materialised whole on the host first "
             "(gigabytes at 128k) for shapes alone; it runs on the GPU only")


@check("production.long_context", title="Production FA4 fwd+bwd at 32k/128k within budget (streamed fp64 oracle)",
       needs={"cuda", "fa4"}, profiles={"long"}, compiles=_compiles)
def long_context(ctx: CheckContext) -> CheckResult:
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the long-context audit runs bf16/fp16; dtype {ctx.dtype} is not covered")
    gpu = ctx.require_gpu()
    where = ctx.where_measured()
    try:
        seqlens = _seqlens()
        stride = row_stride()
    except ValueError as e:
        ctx.skip(str(e))
    results = [(s, run_case(s, device="cuda", dtype=ctx.dtype, seed=int(ctx.seed), row_stride=stride, arch=gpu.arch))
               for s in seqlens]
    return evidence(results, where=where, dtype=ctx.dtype)


def evidence(results, *, where: str, dtype: str) -> CheckResult:
    """The check's result from ``(seqlen, run_case result)`` pairs: verdict table, tightness,
    seconds per phase (:data:`PHASES`) and the tightness histograms (runs on the CPU in the
    tests with the torch32 stand-in)."""
    from fa4verify.judge.verdict import worst_status
    rows, metrics, statuses, reasons, timing, hist = [], {}, [], [], [], []
    for s, r in results:
        j = r["judgement"]
        statuses.append(j.status)
        for n, v in j.verdicts.items():
            rows.append([s, n, v.status, v.n_compared, v.tightness, j.oracle_bound_rel.get(n, float("nan"))])
            metrics[f"s{s}_{n}_tightness"] = v.tightness
            if v.status != "pass":
                reasons.append(f"s{s} {v.summary()}")
        metrics[f"s{s}_n_compared"] = j.n_compared
        phases = phase_seconds(r)
        for ph_name, sec in phases.items():
            metrics[f"s{s}_seconds_{ph_name}"] = sec
        timing.append({"seqlen": s, **{c: round(x, 3) for c, x in phases.items()}})
        for n, hh in j.histograms.items():
            hist.append({"seqlen": s, "tensor": n, **histogram_row(hh)})
    status = worst_status(statuses)
    seqlens = [s for s, _ in results]
    return CheckResult(
        status=status, where=where,
        summary=(f"1 x 8 x hd128 causal {dtype} at seqlen {', '.join(map(str, seqlens))}: "
                 + ("every output within budget" if status == "pass" else "; ".join(reasons[:3]))),
        metrics=metrics,
        details={"table": {"columns": ["seqlen", "tensor", "status", "compared", "tightness", "oracle bound share"],
                           "rows": rows},
                 "phase_seconds": timing,           # seconds per phase, device-synchronised
                 "tightness_histogram": hist,       # judged elements by |err| / allowed
                 **({"plot": pl} if (pl := _live.tightness_vs_seqlen_plot(
                     [(r[0], r[1], r[4]) for r in rows], title="error vs sequence length (causal, hd 128)",
                     where=where)) else {})},
        tightness=max((row[4] for row in rows), default=0.0))
