"""Long-context judgement (32k-128k keys): the streamed float64 oracle
(:mod:`fa4verify.oracles.reference_gpu`) and streamed budget statistics, judged by the one
comparison :func:`fa4verify.judge.verdict.compare`.

:class:`BudgetStats` materialises (nheads, seqlen_q, seqlen_k) weight matrices: 128k x 128k x 8
heads would need 1 TiB. :class:`StreamedBudgetStats` computes the *same* statistics
(``error_budgets/loader.py: STATISTICS``, the same conventions, the same budget formulas through
BudgetStats' own ``forward_out`` / ``forward_lse``) from per-row maxima, prefix / suffix sums
and tile products that the oracle's blocked loops produce, in O(seqlen x head_dim) memory;
``tests/test_judge_long_context.py`` checks it equals BudgetStats on problems both can hold.

Scope: dense batches, causal or not, GQA/MQA; no local window, softcap, learnable sink or
mask_mod (``ValueError`` otherwise). ``row_stride`` > 1 judges every ``row_stride``-th query row
and key row (plus the last), for time: the oracle and the statistics still run over every row
(dK/dV sum over all of them); :attr:`LongContextJudgement.n_compared` says how many elements
were compared.

Two engines evaluate the budgets and compare (the oracle is the same): ``engine="device"``
(default; :mod:`fa4verify.judge.long_context_device`, Note [Device engine]) on the oracle's
device in slabs, only scalars back; ``engine="host"`` with :class:`StreamedBudgetStats` and
:func:`~fa4verify.judge.verdict.compare` in numpy (the cross-check:
``tests/test_long_context_device.py`` checks that both give the same verdicts and budgets).
"""
from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.judge.attention import load_budgets
from fa4verify.judge.stats import BudgetStats, gamma, kernel_constants_for
from fa4verify.judge.verdict import Verdict, compare, worst_status
from fa4verify.kernels import facts

__all__ = ["StreamedBudgetStats", "LongContextJudgement", "judge_long_context", "sample_rows",
           "long_problem"]

_LOG2E = math.log2(math.e)


def sample_rows(n: int, stride: int) -> np.ndarray:
    """Rows 0, stride, 2 stride, ... and the last row (every row for stride 1)."""
    if stride < 1:
        raise ValueError(f"row_stride must be >= 1, got {stride}")
    r = np.arange(0, n, stride)
    if n and r[-1] != n - 1:
        r = np.append(r, n - 1)
    return r


def long_problem(problem: AttentionProblem) -> AttentionProblem:
    """``problem`` if the streamed path supports it, else ValueError naming what it lacks."""
    bad = [n for n, c in (("varlen", problem.varlen), ("softcap", problem.softcap > 0),
                          ("learnable sink", problem.sink), ("mask_mod", problem.mask_mod is not None),
                          ("local window", tuple(problem.window_size) not in ((None, None), (None, 0))
                           or (problem.window_size[1] == 0 and not problem.causal)))
           if c]
    if bad:
        raise ValueError(f"the long-context judge supports dense causal/non-causal problems; not {', '.join(bad)}")
    return problem


class _Tiles:
    """The oracle's :class:`~fa4verify.oracles.reference_gpu.TileObserver`: accumulates the
    tile products the backward statistics need (per query head; torch float64)."""

    def __init__(self, torch, b, sq, sk, H, D, dev, derr, scale):
        z = lambda n: torch.zeros((b, H, n, D), dtype=torch.float64, device=dev)   # noqa: E731
        self.q = {n: z(sq) for n in ("p_dov", "p", "dpd")}
        self.k = {n: z(sk) for n in ("p_dov", "p_derr", "dpd")}
        self.derr = derr          # (b, H, sq)
        self.aK = self.aQ = None
        self.torch = torch

    def bind(self, aQ, aK):
        self.aQ, self.aK = aQ, aK       # (b, H, s, D) |Q|, |K| per query head

    def backward_tile(self, b, r0, r1, c0, c1, *, p, g, dov, keep):
        mm = self.torch.matmul
        aK, aQ = self.aK[b, :, c0:c1], self.aQ[b, :, r0:r1]
        pd = p * dov
        ag = g.abs()
        self.q["p_dov"][b, :, r0:r1] += mm(pd, aK)
        self.q["p"][b, :, r0:r1] += mm(p, aK)
        self.q["dpd"][b, :, r0:r1] += mm(ag, aK)
        self.k["p_dov"][b, :, c0:c1] += mm(pd.transpose(1, 2), aQ)
        self.k["p_derr"][b, :, c0:c1] += mm((p * self.derr[b, :, r0:r1, None]).transpose(1, 2), aQ)
        self.k["dpd"][b, :, c0:c1] += mm(ag.transpose(1, 2), aQ)


class StreamedBudgetStats(BudgetStats):
    """:class:`BudgetStats` of a long dense problem, from streamed quantities, restricted to
    query rows ``rows`` and key rows ``keys`` (the arrays it returns have those rows only).

    Built by :func:`judge_long_context`; numpy float64 on the host."""

    def __init__(self, problem, budget, row: dict, el: dict, abs_o: np.ndarray, nb_bwd: np.ndarray,
                 nrows: int, nkeys: int):
        self.problem, self.budget = problem, budget
        self.kernel = kernel_constants_for(problem)
        self.kc = {"tile_n": float(self.kernel.tile_n), "max_offset": float(self.kernel.max_offset),
                   "threshold": float(self.kernel.rescale_threshold)}
        self.row, self.el, self.abs_o, self._nb_bwd = row, el, abs_o, nb_bwd
        self.H, self.Hk = problem.nheads, problem.nheads_kv
        self.g = self.H // self.Hk
        self.D, self.Dv, self.scale = problem.head_dim, problem.head_dim_v, problem.scale
        self.varlen = False
        self._nr, self._nk = nrows, nkeys

    def _to_out(self, x):
        return x.reshape((self.problem.batch, self._nr) + x.shape[1:])

    def _to_lse(self, x):
        return np.moveaxis(x.reshape(self.problem.batch, self._nr, -1), 1, 2)

    def _to_kv(self, x):
        return x.reshape((self.problem.batch, self._nk) + x.shape[1:])

    def backward(self, *a, **k):   # pragma: no cover - the streamed path has its own
        raise NotImplementedError("StreamedBudgetStats: backward allowances come from judge_long_context")


@dataclasses.dataclass
class LongContextJudgement:
    """Verdicts (``out``, ``lse`` and, with a backward, ``dq``, ``dk``, ``dv``), the seconds of
    each phase, the judged rows and figures of the oracle's bound."""

    verdicts: dict
    seconds: dict
    rows: np.ndarray
    keys: np.ndarray
    oracle_bound_rel: dict       #: max over elements of oracle bound / (oracle bound + budget)
    fingerprint: dict
    #: the composed budgets at the judged rows (out, lse, dq, dk, dv), numpy float64 (the device
    #: engine: only with ``keep_budgets``)
    budgets: dict = dataclasses.field(default_factory=dict, repr=False)
    #: per tensor, judged elements by tightness |err| / allowed: ``{"edges": upper bin edges,
    #: "counts": ...}`` (device engine; the last bin, > 1, holds the violations)
    histograms: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def status(self) -> str:
        return worst_status(v.status for v in self.verdicts.values())

    @property
    def n_compared(self) -> int:
        return sum(v.n_compared for v in self.verdicts.values())

    @property
    def tightness(self) -> float:
        return max((v.tightness for v in self.verdicts.values()), default=0.0)


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x, np.float64)


def _nblocks(causal: bool, sq: int, sk: int, tile: int) -> np.ndarray:
    i = np.arange(sq)
    if not causal:
        return np.full(sq, float((sk - 1) // tile + 1) if sk else 0.0)
    last = np.minimum(sk - 1, i + (sk - sq))
    return np.where(last >= 0, last // tile + 1, 0).astype(np.float64)


def judge_long_context(problem: AttentionProblem, q, k, v, out, lse, *, dout=None, dq=None, dk=None,
                       dv=None, budgets: Any = None, device: Any = None, block: int = 1024,
                       block_k: Optional[int] = None, row_stride: int = 1, threads: int = 8,
                       sync=None, engine: str = "device", chunk: int = 16384,
                       keep_budgets: bool = False) -> LongContextJudgement:
    """Judge a long-context forward (``out``, ``lse``) and, given ``dout``, backward (``dq``,
    ``dk``, ``dv``) against the streamed float64 oracle within the composed budgets.

    ``q, k, v, dout``: torch tensors (b, s, h, d) of the exact inputs; the oracle runs on
    ``device`` (default: theirs). Kernel outputs: torch or numpy, FA4 layouts. ``sync``: a
    callable run before each phase time is taken (``torch.cuda.synchronize``).

    ``engine``: ``"device"`` (default) evaluates the budgets and compares on the oracle's device
    in slabs of ``chunk`` judged rows, only scalars coming back
    (:mod:`fa4verify.judge.long_context_device`, Note [Device engine]); ``"host"`` is the numpy
    path (:class:`StreamedBudgetStats` + :func:`~fa4verify.judge.verdict.compare`), kept as the
    cross-check. ``keep_budgets``: the device engine also returns the composed budgets at the
    judged rows (to the host: only for small problems; the host engine always does)."""
    import torch
    from fa4verify.oracles import reference_gpu as rg

    long_problem(problem)
    if engine not in ("device", "host"):
        raise ValueError(f"engine={engine!r}: expected 'device' or 'host'")
    bs = load_budgets(problem.dtype, problem.arch, budgets)
    dev = torch.device(device) if device is not None else q.device
    q, k, v = (x.to(dev) for x in (q, k, v))
    sync = sync or (lambda: None)
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    B, sq, H, D = q.shape
    sk, Hk, Dv = k.shape[1], k.shape[2], v.shape[3]
    g = H // Hk
    causal = bool(problem.causal)
    scale = problem.scale
    # ---------------- forward oracle
    f = rg.forward(q, k, v, softmax_scale=scale, causal=causal, block=block, block_k=block_k)
    sync()
    secs["oracle_forward"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    kc = kernel_constants_for(problem)
    tn = int(kc.tile_n)
    causal_r, local_r, _, _ = facts.resolve_causal_local_window(problem.causal, problem.window_size)
    tb = int(facts.bwd_tile(problem.arch, D, Dv, causal_r, local_r)[1])
    nb = _nblocks(causal, sq, sk, tn)
    nbb = _nblocks(causal, sq, sk, tb)
    off = sk - sq
    # prefix sums over keys of |V| (per kv head): sum over the keys row i sees
    aV = v.abs().double()
    cV = torch.cumsum(aV, dim=1)                                       # (B, sk, Hk, Dv)
    last = torch.clamp(torch.arange(sq, device=dev) + off, max=sk - 1) if causal else \
        torch.full((sq,), sk - 1, device=dev, dtype=torch.long)
    vis_row = (last >= 0) if sk else torch.zeros(sq, dtype=torch.bool, device=dev)
    last_c = torch.clamp(last, min=0)
    rows_all = f.rows

    def rowstats(ridx: np.ndarray, with_o: bool = True) -> StreamedBudgetStats:
        """BudgetStats' row/element statistics at query rows ``ridx`` (numpy, host)."""
        ri = torch.as_tensor(ridx, device=dev, dtype=torch.long)
        nr = len(ridx)
        sel = lambda x: _np(x[:, :, ri]).transpose(0, 2, 1).reshape(B * nr, H)   # noqa: E731 (b,h,s)->(t,h)
        m, L = sel(rows_all["m"]), sel(f.lse)
        fin = np.isfinite(L)
        anyv = np.broadcast_to(_np(vis_row[ri])[None, :, None] > 0, (B, nr, H)).reshape(B * nr, H)
        row = {"qk_c_max": sel(rows_all["amax"]) * _LOG2E, "sc_max": sel(rows_all["smax"]) * _LOG2E,
               "mc_abs": np.where(anyv & np.isfinite(m), np.abs(m), 0.0) * _LOG2E,
               "softcap_err": np.zeros((B * nr, H)), "lse_abs": np.where(fin, np.abs(L), 0.0)}
        row["lse_log2_abs"] = row["lse_abs"] * _LOG2E
        row["lg2_l"] = np.where(anyv & fin, np.abs(np.where(fin, L, 0.0) - np.where(np.isfinite(m), m, 0.0)) * _LOG2E,
                                0.0) + kc.max_offset + kc.rescale_threshold
        row["seqlen_k"] = np.full((B * nr, H), float(sk))
        row["seqlen_q"] = np.full((B * nr, H), float(sq))
        row["n_blocks"] = np.broadcast_to(nb[ridx][None, :, None], (B, nr, H)).reshape(B * nr, H).copy()
        nbw = np.broadcast_to(nbb[ridx][None, :, None], (B, nr, 1)).reshape(B * nr, 1).copy()
        hk_of = torch.arange(H, device=dev) // g
        sav = cV[:, last_c[ri]][:, :, hk_of] * vis_row[ri][None, :, None, None]     # (B, nr, H, Dv)
        el = {"abs_pv": _np(f.pav[:, ri]).reshape(B * nr, H, Dv), "sum_abs_v": _np(sav).reshape(B * nr, H, Dv)}
        abs_o = np.abs(_np(f.out[:, ri])).reshape(B * nr, H, Dv) if with_o else None
        return StreamedBudgetStats(problem, bs, row, el, abs_o, nbw, nr, 0)

    rows = sample_rows(sq, row_stride)
    keys = sample_rows(sk, row_stride)
    fp = {"nheads": H, "nheads_kv": Hk, "seqlen_q": sq, "seqlen_k": sk, "head_dim": D, "batch": B,
          "causal": causal, "arch": problem.arch, "dtype": problem.dtype, "row_stride": row_stride,
          "block": block, "block_k": block_k or block, "device": str(dev), "engine": engine}
    if engine == "device":
        from fa4verify.judge import long_context_device as lcd
        fp["chunk"] = int(chunk)
        sync()
        secs["budget_forward"] = time.perf_counter() - t1     # the prefix sums; the slabs add theirs
        verdicts, rel, allow, hist = lcd.judge_device(
            problem, bs, f, q, k, v, out, lse, dout=dout, dq=dq, dk=dk, dv=dv, rows=rows, keys=keys, nb=nb,
            nbb=nbb, dev=dev, cV=cV, vis_row=vis_row, last_c=last_c, block=block, block_k=block_k, chunk=chunk,
            secs=secs, sync=sync, keep_budgets=keep_budgets)
        sync()
        secs["total"] = time.perf_counter() - t0
        return LongContextJudgement(verdicts, secs, rows, keys, rel, fp, allow, hist)
    st = rowstats(rows)
    with np.errstate(invalid="ignore", over="ignore"):
        out_budget = st.forward_out()
        lse_budget = st.forward_lse() if "forward_lse" in bs else np.full((B, H, len(rows)), np.nan)
    secs["budget_forward"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    verdicts: dict[str, Verdict] = {}
    ref_out, b_out = _np(f.out[:, rows]), _np(f.bound[:, rows])
    ridx_t = torch.as_tensor(rows, device=dev)
    verdicts["out"] = compare("out", _np(out)[:, rows], ref_out, oracle_bound=b_out, budget=out_budget)
    if lse is None:
        verdicts["lse"] = Verdict("lse", "undecided", 0, 0, len(rows) * B * H, 0.0, 0.0, None, (),
                                  "the target returned no LSE")
    else:
        verdicts["lse"] = compare("lse", _np(lse)[:, :, rows], _np(f.lse[:, :, ridx_t]),
                                  oracle_bound=_np(f.lse_bound[:, :, ridx_t]), budget=lse_budget)
    rel = {"out": _bound_share(b_out, out_budget),
           "lse": _bound_share(_np(f.lse_bound[:, :, ridx_t]), lse_budget)}
    allow = {"out": out_budget, "lse": lse_budget}
    secs["compare_forward"] = time.perf_counter() - t2
    if dout is not None:
        t3 = time.perf_counter()
        dout = dout.to(dev)
        # D's error bound per row from the forward allowances of every row (BudgetStats.backward)
        derr = np.zeros((B, H, sq))
        bp_row = np.zeros((B, sq, H))
        chunk = max(1, min(sq, 4096))

        def one(r0):
            r = np.arange(r0, min(sq, r0 + chunk))
            s = rowstats(r)
            with np.errstate(invalid="ignore", over="ignore"):
                oa = s.forward_out()
                bO = oa + _np(f.bound[:, r])
                ado = np.abs(_np(dout[:, r]))
                O = _np(f.out[:, r])
                de = np.sum(bO * ado, axis=-1) + gamma(Dv) * np.sum((np.abs(O) + bO) * ado, axis=-1)
                c = s._common()
                c.update(s._row_stats(backward=True))
                bp = np.broadcast_to(bs.evaluate("backward_p", c), (B * len(r), H)).reshape(B, len(r), H)
            derr[:, :, r] = np.moveaxis(de, 1, 2)
            bp_row[:, r] = bp

        with ThreadPoolExecutor(max_workers=max(1, threads)) as ex:
            list(ex.map(one, range(0, sq, chunk)))
        secs["budget_derr"] = time.perf_counter() - t3
        t4 = time.perf_counter()
        obs = _Tiles(torch, B, sq, sk, H, D, dev, torch.as_tensor(derr, device=dev), scale)
        hq = lambda x: x.double().abs().permute(0, 2, 1, 3)                    # noqa: E731 (b,h,s,d)
        obs.bind(hq(q), hq(k).repeat_interleave(g, dim=1) if g > 1 else hq(k))
        ob = rg.backward(q, k, v, dout, softmax_scale=scale, causal=causal, block=block, block_k=block_k,
                         fwd=f, observer=obs)
        sync()
        secs["oracle_backward"] = time.perf_counter() - t4
        t5 = time.perf_counter()
        vb, bb = _backward_verdicts(problem, bs, st, ob, obs, rows, keys, bp_row, nb, nbb, dev,
                                    q, k, dout, causal, dq, dk, dv, rel)
        verdicts.update(vb)
        allow.update(bb)
        secs["budget_compare_backward"] = time.perf_counter() - t5
    secs["total"] = time.perf_counter() - t0
    return LongContextJudgement(verdicts, secs, rows, keys, rel, fp, allow)


def _bound_share(bound: np.ndarray, budget: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore"):
        r = bound / (bound + budget)
    r = r[np.isfinite(r)]
    return float(r.max()) if r.size else math.nan


def _backward_verdicts(problem, bs, st, ob, obs, rows, keys, bp_row, nb, nbb, dev, q, k, dout, causal,
                       dq, dk, dv, rel) -> dict:
    import torch
    B, sq, H, D = q.shape
    sk, Hk, Dv = k.shape[1], k.shape[2], ob.dv.shape[3]
    g = H // Hk
    sc = problem.scale
    off = sk - sq
    nr, nk = len(rows), len(keys)
    ri = torch.as_tensor(rows, device=dev)
    ki = torch.as_tensor(keys, device=dev)
    hk_of = torch.arange(H, device=dev) // g
    aK = k.abs().double()
    aQ = q.abs().double()
    adO = dout.abs().double()
    # ---- dq (query rows): prefix sums of |K| over the keys a row sees
    cK = torch.cumsum(aK, dim=1)
    last = torch.clamp(torch.arange(sq, device=dev) + off, max=sk - 1) if causal else \
        torch.full((sq,), sk - 1, device=dev, dtype=torch.long)
    vis = (last >= 0).double()
    subk = cK[:, torch.clamp(last, min=0)][:, :, hk_of] * vis[None, :, None, None] * sc     # (B, sq, H, D)
    qsel = lambda x: _np(x.permute(0, 2, 1, 3)[:, ri]).reshape(B * nr, H, -1)   # noqa: E731 (b,h,s,d)
    q_el = {"abs_dsk": _np(ob.aux["dsk_abs"][:, ri]).reshape(B * nr, H, D),
            "abs_p_dov_k": sc * qsel(obs.q["p_dov"]),
            "sub_dsk": _np(subk[:, ri]).reshape(B * nr, H, D),
            "abs_dpd_k": sc * qsel(obs.q["dpd"]),
            "abs_tanh_dsk": np.zeros((B * nr, H, D))}       # no softcap in this scope (its refusal above)
    derr_rows = _np(obs.derr[:, :, ri]).transpose(0, 2, 1).reshape(B * nr, H)
    q_el["abs_p_derr_k"] = sc * derr_rows[..., None] * qsel(obs.q["p"])
    stq = st._common()
    for n, x in st._row_stats(backward=True).items():
        stq[n] = x[..., None]
    stq["backward_p"] = bp_row[:, rows].reshape(B * nr, H)[..., None]
    stq.update(q_el)
    stq["abs_dq"] = np.abs(_np(ob.dq[:, ri])).reshape(B * nr, H, D)
    out = {}
    with np.errstate(invalid="ignore", over="ignore"):
        bud_dq = np.broadcast_to(bs.evaluate("backward_dq", stq), (B * nr, H, D)).reshape(B, nr, H, D)
    # ---- dk, dv (key rows): suffix sums over the queries that see a key, summed over a group
    rev = lambda x: torch.flip(torch.cumsum(torch.flip(x, [1]), dim=1), [1])   # noqa: E731
    i0 = torch.clamp(torch.arange(sk, device=dev) - off, min=0) if causal else torch.zeros(sk, dtype=torch.long, device=dev)
    seen = (i0 < sq).double()
    i0c = torch.clamp(i0, max=max(sq - 1, 0))
    grp = lambda x: x.reshape(B, x.shape[1], Hk, g, x.shape[-1]).sum(dim=3)   # noqa: E731 (b,s,h,d)->(b,s,hk,d)
    subq = grp(rev(aQ))[:, i0c] * seen[None, :, None, None] * sc              # (B, sk, Hk, D)
    sdo = grp(rev(adO))[:, i0c] * seen[None, :, None, None]
    ksel = lambda x: _np(grp(x.permute(0, 2, 1, 3))[:, ki]).reshape(B * nk, Hk, -1)   # noqa: E731
    k_el = {"abs_dsq": _np(ob.aux["dsq_abs"][:, ki]).reshape(B * nk, Hk, D),
            "abs_p_dov_q": sc * ksel(obs.k["p_dov"]), "abs_p_derr_q": sc * ksel(obs.k["p_derr"]),
            "sub_dsq": _np(subq[:, ki]).reshape(B * nk, Hk, D), "abs_dpd_q": sc * ksel(obs.k["dpd"]),
            "abs_tanh_dsq": np.zeros((B * nk, Hk, D))}
    # k_row: seqlen_q = sq * g, n_blocks and backward_p = maxima over the batch entry's rows
    nbk = float(np.maximum(nb, nbb).max()) if sq else 0.0
    bpk = bp_row.reshape(B, sq, Hk, g).max(axis=(1, 3)) if sq else np.zeros((B, Hk))   # (B, Hk)
    stk = st._common()
    stk.update({"seqlen_q": np.full((B * nk, Hk, 1), float(sq * g)), "seqlen_k": np.full((B * nk, Hk, 1), float(sk)),
                "n_blocks": np.full((B * nk, Hk, 1), nbk),
                "backward_p": np.broadcast_to(bpk[:, None, :, None], (B, nk, Hk, 1)).reshape(B * nk, Hk, 1)})
    stk.update(k_el)
    stk["abs_dk"] = np.abs(_np(ob.dk[:, ki])).reshape(B * nk, Hk, D)
    with np.errstate(invalid="ignore", over="ignore"):
        bud_dk = np.broadcast_to(bs.evaluate("backward_dk", stk), (B * nk, Hk, D)).reshape(B, nk, Hk, D)
        stk.update({"abs_pdo": _np(ob.aux["pdo_abs"][:, ki]).reshape(B * nk, Hk, Dv),
                    "sum_abs_do": _np(sdo[:, ki]).reshape(B * nk, Hk, Dv)})
        stk["abs_dv"] = np.abs(_np(ob.dv[:, ki])).reshape(B * nk, Hk, Dv)
        bud_dv = np.broadcast_to(bs.evaluate("backward_dv", stk), (B * nk, Hk, Dv)).reshape(B, nk, Hk, Dv)
    res = {}
    for n, got, ref, bnd, bud, idx in (("dq", dq, ob.dq, ob.dq_bound, bud_dq, ri), ("dk", dk, ob.dk, ob.dk_bound, bud_dk, ki),
                                       ("dv", dv, ob.dv, ob.dv_bound, bud_dv, ki)):
        if got is None:
            continue
        sel = rows if n == "dq" else keys
        b_ = _np(bnd[:, idx])
        res[n] = compare(n, _np(got)[:, sel], _np(ref[:, idx]), oracle_bound=b_, budget=bud)
        rel[n] = _bound_share(b_, bud)
    return res, {"dq": bud_dq, "dk": bud_dk, "dv": bud_dv}
