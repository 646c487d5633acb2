"""Cases and targets shared by the live production checks (``budgets.production.*``).

The cases come from the audit's deployment profile when it has one (``ctx.deploy``), else a
fixed grid (hd 64/128, causal and not, 2 heads, seqlen 512). The target is
:class:`fa4verify.targets.ProductionTarget` on the local GPU, whatever arch FA4 runs there; on
SM100/SM103 the forward check also runs FA4 with its exp2 emulation disabled.
"""
from __future__ import annotations

from typing import Any

from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.audit.registry import CheckContext
from fa4verify.kernels import facts

def target(ctx: CheckContext, *, device: str, emulation: str = "default"):
    """The production target and the arch its kernels run (skips on an unsupported GPU)."""
    from fa4verify.kernels import adapter
    from fa4verify.targets import ProductionTarget
    if device == "cuda":
        gpu = ctx.require_gpu()
        return ProductionTarget(emulation=emulation), gpu.arch, ctx.where_measured()
    # stand-in adapter on the CPU (tests): the arch it claims to be
    return ProductionTarget(adapter=adapter, device=device), "sm90", "CPU"


def _heads(nheads: int, nheads_kv: int, cap: int = 4) -> tuple[int, int]:
    """A head count at most ``cap`` query heads that keeps the deployment's GQA group size."""
    g = max(1, nheads // nheads_kv)
    hk = max(1, min(nheads_kv, cap // g))
    return g * hk, hk


def problems(ctx: CheckContext, arch: str, dtype: str, *, seqlen: int = 512) -> list[AttentionProblem]:
    """The live cases of this audit on ``arch`` (see the module docstring)."""
    vs = ValueSpec("normal", int(ctx.seed))
    out: list[AttentionProblem] = []
    dep = ctx.deploy
    if dep is not None:
        for c in dep.live_cases(arch=arch, dtype=dtype, seqlens=(seqlen,), limit=4):
            hq, hk = _heads(c["nheads"], c["nheads_kv"])
            out.append(AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=c["seqlen"], seqlen_k=c["seqlen"],
                                        nheads=hq, nheads_kv=hk, head_dim=c["head_dim"], head_dim_v=c["head_dim_v"],
                                        causal=c["causal"], window_size=tuple(c["window_size"]),
                                        softcap=float(c["softcap"]), sink=bool(c["sink"]),
                                        sink_dtype=c["sink_dtype"], softmax_scale=c["softmax_scale"], values=vs))
        if not out:
            ctx.skip(f"deployment {dep.name!r} ships no head dims FA4 supports on {arch} "
                     f"({facts.supported_head_dims_text(arch)})")
        return out
    for hd in (64, 128):
        for causal in (False, True):
            out.append(AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=seqlen, seqlen_k=seqlen,
                                        nheads=2, nheads_kv=2, head_dim=hd, head_dim_v=hd, causal=causal, values=vs))
    return out


def tag(p: AttentionProblem) -> str:
    mask = "causal" if p.causal else ("window" if p.local else "full")
    extra = (" sink" if p.sink else "") + (f" softcap{p.softcap:g}" if p.softcap else "")
    if p.values.distribution != "normal":
        extra += f" {p.values.distribution}"
    gqa = f" h{p.nheads}/{p.nheads_kv}" if p.nheads != p.nheads_kv else ""
    return f"hd{p.head_dim} {mask} s{p.seqlen_q}{gqa}{extra}"


def rms_err(x: Any, ref: Any) -> float:
    import numpy as np
    a, r = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    m = np.isfinite(r) & np.isfinite(a)
    return float(np.sqrt(np.mean((a[m] - r[m]) ** 2))) if m.any() else float("nan")


def tightness_vs_seqlen_plot(points, *, title: str, where: str = "") -> dict | None:
    """A ``lines`` plot (``details["plot"]``) of tightness per tensor against the sequence length,
    log-log, with the budget line at 1; ``points`` = (seqlen, tensor, tightness). None when the
    points span fewer than two sequence lengths (nothing to draw a trend from)."""
    import math
    seqlens = sorted({int(s) for s, _, _ in points})
    if len(seqlens) < 2:
        return None
    by: dict[str, dict[int, float]] = {}
    for s, n, t in points:
        t = float(t)
        if math.isfinite(t) and t > 0:
            cur = by.setdefault(str(n), {})
            cur[int(s)] = max(cur.get(int(s), 0.0), t)
    series = {n: [d.get(s, float("nan")) for s in seqlens] for n, d in by.items()}
    if not series:
        return None
    return {"kind": "lines", "title": title, "x": seqlens, "series": series, "budget": 1.0,
            "xlabel": "sequence length (keys)", "ylabel": "max tightness (error / budget)",
            "logx": True, "logy": True, "where": where}
