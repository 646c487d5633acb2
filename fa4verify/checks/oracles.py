"""Audit checks for the attention oracles (``fa4verify.oracles``): the truth checks itself.

``oracles.fast_vs_arbiter`` (bf16, fp16, fp8 e4m3 inputs): random small problems with every feature (causal, windows, softcap,
learnable sinks, GQA/MQA, varlen with empty sequences, seqlen_q != seqlen_k, dlse); the certified
float64 reference and the mpmath arbiter (80/160 bits) must agree within the sum of their stated
bounds for out, lse, dq, dk, dv, d and dsink. Metrics: violations (must be 0), the tightness
max |fast - arbiter| / fast bound, and the worst forward bound relative to sum_j P_j |V_j|.
"""
from __future__ import annotations

import math
from typing import Any

from fa4verify.audit.registry import CheckContext, CheckResult, check

__all__ = ["random_problem", "compare_fast_arbiter"]

_N_PROBLEMS = {"quick": 6, "default": 24, "full": 150, "exhaustive": 1000}


def random_problem(rng: Any, dtype: str = "bf16", max_len: int = 5) -> dict:
    """A random small attention problem as keyword arguments for ``attention.backward``
    (plus ``"dtype"``): q, k, v, out=None, dout, and a random mix of every feature."""
    import ml_dtypes
    import numpy as np

    dt = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32,
          "fp8": ml_dtypes.float8_e4m3fn}[dtype]
    hk = int(rng.integers(1, 3))
    h = hk * int(rng.integers(1, 4))
    d = int(rng.integers(1, 9))
    dv = d if rng.random() < 0.5 else int(rng.integers(1, 9))
    sigma = float(rng.choice([0.5, 1.0, 2.5]))

    def arr(shape, s=sigma):
        return (rng.standard_normal(shape) * s).astype(np.float32).astype(dt)

    kw: dict = {}
    if rng.random() < 0.4:
        nb = int(rng.integers(1, 4))
        lq = rng.integers(0, max_len + 1, nb)
        lk = rng.integers(0, max_len + 1, nb)
        kw["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        kw["cu_seqlens_k"] = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
        qs, ks, vs, dos = (int(lq.sum()), h, d), (int(lk.sum()), hk, d), (int(lk.sum()), hk, dv), (int(lq.sum()), h, dv)
        lse_shape = (h, int(lq.sum()))
    else:
        b, sq, sk = int(rng.integers(1, 3)), int(rng.integers(1, max_len + 1)), int(rng.integers(1, max_len + 1))
        qs, ks, vs, dos = (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), (b, sq, h, dv)
        lse_shape = (b, h, sq)
    kw["causal"] = bool(rng.random() < 0.5)
    if rng.random() < 0.4:
        pick = lambda: None if rng.random() < 0.3 else int(rng.integers(-2, 5))  # noqa: E731
        kw["window_size"] = (pick(), pick())
    if rng.random() < 0.4:
        kw["softcap"] = float(rng.choice([0.5, 1.0, 3.0, 10.0]))
    if rng.random() < 0.4:
        kw["learnable_sink"] = arr((h,), 2.0)
    if rng.random() < 0.3:
        kw["dlse"] = rng.standard_normal(lse_shape) * 0.5
    return dict(q=arr(qs), k=arr(ks), v=arr(vs), out=None, dout=arr(dos, 1.0), dtype=dtype, **kw)


def compare_fast_arbiter(prob: dict, bits: int = 80) -> dict:
    """Run fast and arbiter forward+backward on ``prob``; return violation count, tightness and
    the worst forward bound relative to sum |P||V| (log2)."""
    import numpy as np

    from fa4verify.oracles import attention, stats

    kw = {k: v for k, v in prob.items() if k not in ("q", "k", "v", "out", "dout", "dtype", "dlse")}
    q, k, v = prob["q"], prob["k"], prob["v"]
    viol, tight = 0, 0.0
    fast_f = attention.forward(q, k, v, **kw)
    arb_f = attention.forward(q, k, v, precision=bits, **kw)
    fast_b = attention.backward(q, k, v, None, prob["dout"], dlse=prob.get("dlse"), **kw)
    arb_b = attention.backward(q, k, v, None, prob["dout"], dlse=prob.get("dlse"), precision=bits, **kw)
    pairs = [(fast_f.out, fast_f.bound, arb_f.out, arb_f.bound), (fast_f.lse, fast_f.lse_bound, arb_f.lse, arb_f.lse_bound)]
    for n in ("dq", "dk", "dv", "d", "dsink"):
        x = getattr(fast_b, n)
        if x is not None:
            pairs.append((x, getattr(fast_b, n + "_bound"), getattr(arb_b, n), getattr(arb_b, n + "_bound")))
    for a, ab, b, bb in pairs:
        a, b = np.asarray(a, float), np.asarray(b, float)
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = np.where((a == b) & np.isinf(a), 0.0, np.abs(a - b))
            viol += int((~(diff <= ab + bb)).sum())
            r = np.where(ab > 0, diff / ab, 0.0)
        tight = max(tight, float(r.max(initial=0.0)))
    s = stats.forward_stats(q, k, v, **kw)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(s.sum_abs_pv > 0, fast_f.bound / s.sum_abs_pv, 0.0)
    worst = float(rel.max(initial=0.0))
    return dict(violations=viol, tightness=tight, log2_rel_bound=math.log2(worst) if worst > 0 else -math.inf)


@check("oracles.fast_vs_arbiter", title="Attention oracles: certified float64 reference within its bound of the mpmath arbiter",
       needs={"cpu"}, profiles={"quick", "default", "full", "exhaustive"})
def fast_vs_arbiter(ctx: CheckContext) -> CheckResult:
    if ctx.dtype not in ("bf16", "fp16", "fp8"):
        return CheckResult(status="skip", summary=f"oracle self-check runs on bf16/fp16/fp8 inputs, not {ctx.dtype}")
    rng = ctx.rng("oracles.fast_vs_arbiter")
    n = _N_PROBLEMS.get(ctx.profile, 24)
    viol, tight, worst_rel = 0, 0.0, -math.inf
    bad_cases: list[str] = []
    with ctx.progress(n, "fast reference vs mpmath arbiter") as bar:
        for i in range(n):
            prob = random_problem(rng, ctx.dtype)
            r = compare_fast_arbiter(prob)
            viol += r["violations"]
            tight = max(tight, r["tightness"])
            worst_rel = max(worst_rel, r["log2_rel_bound"])
            if r["violations"] and len(bad_cases) < 5:
                bad_cases.append(f"problem {i}: q{tuple(prob['q'].shape)} k{tuple(prob['k'].shape)} "
                                 f"{ {k: v for k, v in prob.items() if k in ('causal', 'window_size', 'softcap')} }")
            bar.advance(1)
    status = "fail" if viol else "pass"
    summary = (f"{n} random problems, fwd+bwd: {viol} values outside the stated bounds; "
               f"max |fast-arbiter|/bound = {tight:.3g}; worst out bound = 2^{worst_rel:.1f} x sum|P||V|")
    return CheckResult(status=status, where="CPU", summary=summary,
                       metrics={"violations": viol, "bound_tightness": tight, "log2_out_bound_rel": worst_rel,
                                "problems_higher_is_better": n},
                       details={"failing_cases": bad_cases, "seed": ctx.seed, "profile": ctx.profile},
                       tightness=tight)
