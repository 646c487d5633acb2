"""Stage budgets of FA4's forward/backward (the judge's side): every stage of the CPU twin against
its local budget, the twin's (or production's) outputs against the composed budgets, and which stage
the error comes from (attribution is one function of it, :func:`attribute_forward`).

Figures from this module come from the **CPU twin** (``fa4verify.kernels.twin.attention``) unless a
caller passes production outputs (``check_forward_outputs``: "measured on <GPU> (sm_XY)").

* :class:`StageRecorder` -- a ``stage_probe`` for the twin: every application of every stage is
  compared with its *local* budget (``[stage.*]`` in ``error_budgets/<dtype>_<arch>.toml``):
  ``|fa4 - exact(same inputs)| <= budget(stats)`` elementwise; tightness = max ratio.
* :func:`check_forward` / :func:`check_backward` -- run the twin with the recorder, compare its
  outputs with the oracle (``fa4verify.oracles.attention``) under the composed budgets.
* :func:`attribute_forward` -- which stage dominates the forward error: for each stage, the
  error of the twin with *only that stage* as FA4 (all others exact: "isolated") and the drop in
  error when *only that stage* is made exact ("ablation").
* :func:`fwd_bwd_p_mismatch` -- the SM100 forward (emulated) vs backward (hardware) P mismatch
  and its effect on dQ, dK, dV.

Every comparison is ``(actual, reference)`` with errors relative to the reference side.

End-to-end verdicts come from the judge core (:mod:`fa4verify.judge`: one comparison, one
statistics producer). Possible issues: the dense entry points here cover dense problems
with causal/window masks, GQA/MQA, softcap and learnable sinks (forward) and bf16/fp16/fp8;
softcap/sinks in the backward and varlen are not covered by the composed statistics -- the twin
itself supports sinks and softcap everywhere (local stage budgets through the stage probe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np

F64 = np.float64
LOG2E = math.log2(math.e)

__all__ = ["StageTally", "StageRecorder", "check_forward", "check_backward",
           "check_forward_outputs", "check_backward_outputs", "attribute_forward",
           "fwd_bwd_p_mismatch", "ForwardCheck", "BackwardCheck", "ATTRIBUTION_STAGES",
           "gen_inputs", "DISTRIBUTIONS"]

ATTRIBUTION_STAGES: tuple[str, ...] = (
    "s_accum", "exp_arg", "exp2", "exp2_emu", "p_cast", "row_sum", "rescale", "pv_accum",
    "rcp", "normalize", "o_cast", "lse",
)
DISTRIBUTIONS: tuple[str, ...] = ("normal", "outliers", "negative", "peaked")


# =========================================================================== inputs
def gen_inputs(dist: str, *, batch: int, seqlen_q: int, seqlen_k: int, nheads: int, hdim: int,
               dtype: str = "bf16", seed: int = 0, with_dout: bool = False):
    """Test inputs (b, s, h, d) rounded to ``dtype`` (values as float32):

    * ``normal``: N(0, 1).
    * ``outliers``: N(0,1) + N(0,100) * Bernoulli(0.001) (FA3 paper, §4.3).
    * ``negative``: deeply negative scores (cuDNN-frontend #744): q ~ N(0,1) + 2, k ~ N(0,1) - 2
      so every score sits around -4 hdim (all P tiny relative to 2^-126 before the max shift).
    * ``peaked``: rows whose max grows by ~6-10 log2 units from KV block to KV block (near the
      SM100 rescale threshold 8): k's first coordinate ramps with the key index.
    """
    from fa4verify.oracles import binary32 as b32
    rng = np.random.default_rng(seed)
    cast = {"bf16": b32.to_bf16, "fp16": b32.to_fp16,
            "fp8": lambda x: b32.to_fp8_e4m3fn(x)}[dtype]
    sq = (batch, seqlen_q, nheads, hdim)
    sk = (batch, seqlen_k, nheads, hdim)

    def nrm(s):
        return rng.standard_normal(s)
    if dist == "normal":
        q, k, v = nrm(sq), nrm(sk), nrm(sk)
    elif dist == "outliers":
        def o(s):
            return nrm(s) + rng.normal(0, 10.0, s) * (rng.random(s) < 0.001)   # sd 10: var 100
        q, k, v = o(sq), o(sk), o(sk)
    elif dist == "negative":
        q, k, v = nrm(sq) * 0.5 + 2.0, nrm(sk) * 0.5 - 2.0, nrm(sk)
    elif dist == "peaked":
        q = nrm(sq) * 0.1
        q[..., 0] = 4.0
        k = nrm(sk) * 0.1
        # ~ +7 log2 units per 128-key block along the visiting order (last block first)
        ramp = (np.arange(seqlen_k)[::-1] / 128.0) * 7.0 / (4.0 * math.log2(math.e) / math.sqrt(hdim))
        k[..., 0] = (ramp[None, :, None] + rng.random((batch, seqlen_k, nheads)) * 0.5) / 1.0
        v = nrm(sk)
    else:
        raise ValueError(f"unknown distribution {dist!r}; expected {DISTRIBUTIONS}")
    out = [cast(np.asarray(a, np.float32)).astype(np.float32) for a in (q, k, v)]
    if with_dout:
        out.append(cast(nrm((batch, seqlen_q, nheads, hdim)).astype(np.float32)).astype(np.float32))
    return tuple(out)


# =========================================================================== local stage checks
@dataclass
class StageTally:
    """Local budget results of one stage over all its applications in a run."""
    stage: str
    n: int = 0
    max_err: float = 0.0
    max_ratio: float = 0.0      #: max |fa4 - exact| / budget (tightness; <= 1 within budget)
    n_over: int = 0
    worst: str = ""
    no_budget: bool = False
    n_unjudged: int = 0       #: elements whose stage budget is negative or non-finite (undecided)


class StageRecorder:
    """``stage_probe`` for the twin: tallies every stage application against its local budget.

    Non-finite handling: elements where the exact value is not finite or masked out by the
    sample's ``where`` are skipped; an as-FA4 NaN/inf where the exact value is finite counts as
    over budget (ratio inf).
    """

    def __init__(self, budgets):
        self.budgets = budgets
        self.tallies: dict[str, StageTally] = {}

    def __call__(self, sample) -> None:
        t = self.tallies.setdefault(sample.stage, StageTally(sample.stage))
        if sample.stage not in self.budgets:
            t.no_budget = True
            return
        v = stage_verdict(self.budgets, sample)
        tally_verdict(t, v)


def stage_verdict(budgets, sample, base_stats=None):
    """The judge's verdict (:func:`fa4verify.judge.compare`) on one stage application: the stage's
    as-FA4 value against the exact value of the same inputs within the stage's local budget.
    Elements where the exact value is not finite, or outside ``sample.where``, are not selected."""
    from fa4verify.judge import compare
    fa4 = np.asarray(sample.fa4, F64)
    ex = np.asarray(sample.exact, F64)
    fa4, ex = np.broadcast_arrays(fa4, ex)
    sel = np.isfinite(ex)
    if sample.where is not None:
        sel = sel & np.broadcast_to(np.asarray(sample.where, bool), sel.shape)
    stats = dict(base_stats or {})
    stats.update({k: (np.broadcast_to(np.asarray(v, F64), fa4.shape) if np.ndim(v) else v)
                  for k, v in sample.stats.items()})
    with np.errstate(invalid="ignore", over="ignore"):
        bound = np.broadcast_to(np.asarray(budgets.evaluate(sample.stage, stats), F64), fa4.shape)
    return compare(sample.stage, fa4, ex, budget=bound, select=sel)


def tally_verdict(t, v) -> None:
    """Add one stage verdict to a tally (``n``, ``n_over``, ``n_unjudged``, ``max_err``,
    ``max_ratio``, ``worst``)."""
    if v.n_compared == 0 and v.n_unjudged == 0:
        return
    t.n += v.n_compared
    t.n_over += v.n_over
    t.n_unjudged = getattr(t, "n_unjudged", 0) + v.n_unjudged
    if hasattr(t, "max_err"):
        t.max_err = max(t.max_err, v.max_abs_err)
    if v.tightness > t.max_ratio and v.worst is not None:
        t.max_ratio = v.tightness
        t.worst = (f"{v.name}: |{v.worst.actual:.9g} - {v.worst.ref:.9g}| = {v.worst.err:.3g} vs budget "
                   f"{v.worst.allowed:.3g}")


def _bhsd(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, F64).transpose(0, 2, 1, 3))


# =========================================================================== checks
@dataclass
class ForwardCheck:
    """Local stage tallies + end-to-end results of one forward problem ("CPU twin" unless
    ``where`` says otherwise)."""
    where: str
    stages: dict[str, StageTally]
    out_ratio: float             #: max |out - O_oracle| / (forward_out + oracle.bound)
    out_over: int
    lse_ratio: float
    lse_over: int
    max_abs_err: float
    config: dict = field(default_factory=dict)
    out_ratio_prob: float = float("nan")   #: the same vs ``forward_out_prob`` (Higham-Mary)
    verdicts: tuple = ()                   #: the judge's :class:`~fa4verify.judge.Verdict` (out, lse)

    @property
    def stages_ok(self) -> bool:
        return all(t.n_over == 0 for t in self.stages.values())

    @property
    def status(self) -> str:
        """fail | undecided | pass of the end-to-end verdicts and the stage tallies together."""
        from fa4verify.judge import worst_status
        st = [v.status for v in self.verdicts] or ["pass"]
        if not self.stages_ok:
            st.append("fail")
        if any(t.n_unjudged for t in self.stages.values()):
            st.append("undecided")
        return worst_status(st)

    @property
    def ok(self) -> bool:
        return self.status == "pass"


def _oracle_forward(q, k, v, *, softmax_scale, causal, window_size, softcap=0.0,
                    learnable_sink=None):
    from fa4verify.oracles import attention
    return attention.forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, softcap=softcap,
                             learnable_sink=learnable_sink)


def check_forward_outputs(out, lse, q, k, v, *, arch: str, dtype: str, softmax_scale=None,
                          causal=False, window_size=(None, None), budgets=None, where: str = "CPU twin",
                          oracle=None, softcap: float = 0.0, learnable_sink=None) -> ForwardCheck:
    """End-to-end verdicts on given forward outputs (production or twin): the judge's
    ``|out - O_oracle| <= forward_out(stats) + oracle.bound`` and the same for the LSE
    (:func:`fa4verify.judge.judge_forward`)."""
    from fa4verify import judge
    problem = judge.dense_problem(q, k, v, arch=arch, dtype=dtype, causal=causal, window_size=window_size,
                                  softmax_scale=softmax_scale, softcap=softcap, sink=learnable_sink is not None)
    a = judge.arrays_from(q, k, v, learnable_sink=learnable_sink)
    j = judge.judge_forward(problem, a, np.asarray(out, F64), None if lse is None else np.asarray(lse, F64),
                            budgets=budgets, oracle=oracle)
    prob = j.prob.tightness if j.prob is not None else float("nan")
    return ForwardCheck(where=where, stages={}, out_ratio=j.out.tightness, out_over=j.out.n_over,
                        lse_ratio=j.lse.tightness, lse_over=j.lse.n_over, max_abs_err=j.out.max_abs_err,
                        config={"arch": arch, "dtype": dtype, "tile_n": j.stats.kernel.tile_n},
                        out_ratio_prob=prob, verdicts=(j.out, j.lse))


def check_forward(q, k, v, *, arch: str, dtype: str = "bf16", causal=False,
                  window_size=(None, None), softmax_scale=None, accumulation="exact-then-round",
                  mufu="correctly-rounded", seed=0, mutations=frozenset(), budgets=None,
                  e2e: bool = True, softcap: float = 0.0,
                  learnable_sink=None) -> ForwardCheck:
    """Run the CPU twin forward with a :class:`StageRecorder`, then the end-to-end check."""
    from fa4verify import error_budgets as eb
    from fa4verify.kernels.twin import attention as ta
    bs = budgets or eb.load(dtype, arch)
    rec = StageRecorder(bs)
    r = ta.forward(q, k, v, arch=arch, dtype=dtype,
                   causal=causal, window_size=window_size, softmax_scale=softmax_scale,
                   accumulation=accumulation, mufu=mufu, seed=seed, mutations=mutations,
                   softcap=softcap, learnable_sink=learnable_sink, stage_probe=rec)
    if e2e:
        fc = check_forward_outputs(r.out, r.lse, q, k, v, arch=arch, dtype=dtype,
                                   softmax_scale=softmax_scale, causal=causal,
                                   window_size=window_size, budgets=bs,
                                   where="CPU twin", softcap=softcap,
                                   learnable_sink=learnable_sink)
    else:
        fc = ForwardCheck("CPU twin", {}, 0.0, 0, 0.0, 0, 0.0)
    fc.stages = rec.tallies
    fc.config.update({"accumulation": accumulation, "mufu": mufu,
                      "emulated_fraction": r.stages["emulated_fraction"],
                      "p_max": float(np.max(r.stages["p_max"], initial=0.0))})
    return fc


@dataclass
class BackwardCheck:
    where: str
    stages: dict[str, StageTally]
    ratios: dict[str, float]     #: dq/dk/dv: max |g - g_oracle| / (budget + oracle bound)
    over: dict[str, int]
    rel_err: dict[str, float]    #: max |g - g_oracle| / max |g_oracle|
    verdicts: tuple = ()         #: the judge's verdicts (dq, dk, dv)

    @property
    def status(self) -> str:
        from fa4verify.judge import worst_status
        st = [v.status for v in self.verdicts] or ["pass"]
        if any(t.n_over for t in self.stages.values()):
            st.append("fail")
        return worst_status(st)


def check_backward_outputs(dq, dk, dv, q, k, v, dout, *, arch: str, dtype: str = "bf16",
                           causal=False, window_size=(None, None), softmax_scale=None,
                           budgets=None, where="CPU twin") -> BackwardCheck:
    """Gradients vs the oracle's exact gradient within the composed backward budgets: the
    judge's verdicts (:func:`fa4verify.judge.judge_backward`)."""
    from fa4verify import judge
    problem = judge.dense_problem(q, k, v, arch=arch, dtype=dtype, causal=causal, window_size=window_size,
                                  softmax_scale=softmax_scale)
    a = judge.arrays_from(q, k, v, dout)
    j = judge.judge_backward(problem, a, np.asarray(dq, F64), np.asarray(dk, F64), np.asarray(dv, F64),
                             budgets=budgets, probabilistic=False)   # the worst-case tier only
    ratios, over, rel = {}, {}, {}
    for vd in j.verdicts:
        ref = np.asarray(getattr(j.oracle, vd.name), F64)
        ratios[vd.name] = vd.tightness
        over[vd.name] = vd.n_over
        rel[vd.name] = float(vd.max_abs_err / max(np.abs(ref).max(initial=0), 1e-300))
    return BackwardCheck(where=where, stages={}, ratios=ratios, over=over, rel_err=rel, verdicts=j.verdicts)


def check_backward(q, k, v, dout, *, arch: str, dtype: str = "bf16", causal=False,
                   window_size=(None, None), softmax_scale=None, accumulation="exact-then-round",
                   mufu="correctly-rounded", seed=0, mutations=frozenset(), budgets=None,
                   deterministic=True) -> BackwardCheck:
    """CPU twin forward + backward, backward stage tallies, gradients vs the oracle."""
    from fa4verify import error_budgets as eb
    from fa4verify.kernels.twin import attention as ta
    bs = budgets or eb.load(dtype, arch)
    rec = StageRecorder(bs)
    kw = dict(arch=arch, dtype=dtype, causal=causal, window_size=window_size,
              softmax_scale=softmax_scale, accumulation=accumulation, mufu=mufu, seed=seed)
    fr = ta.forward(q, k, v, mutations=frozenset(mutations) & set(ta.FWD_MUTATIONS), **kw)
    g = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, deterministic=deterministic,
                    mutations=mutations, stage_probe=rec, out_fp32=fr.stages["o_fp32"], **kw)
    bc = check_backward_outputs(g.dq, g.dk, g.dv, q, k, v, dout, arch=arch, dtype=dtype,
                                causal=causal, window_size=window_size,
                                softmax_scale=softmax_scale, budgets=bs, where="CPU twin")
    bc.stages = rec.tallies
    return bc


# =========================================================================== attribution
def _arch_of(config) -> str:
    """fa4verify's arch of the kernel family FA4 ran (``CallConfig.arch``, e.g. 90, 100, 103)."""
    from fa4verify.kernels import facts
    fam = int(getattr(config, "arch", 90))
    arch = facts.arch_from_capability(fam // 10, fam % 10)
    if arch is None:
        raise ValueError(facts.unsupported_reason(fam // 10, fam % 10))
    return arch


def _production_run(adapter, q, k, v, do, *, causal: bool, dtype: str, device: str, backward: bool):
    """Production (or a stand-in adapter) through the one target layer, fa4verify.targets."""
    from fa4verify import judge
    from fa4verify.targets import ProductionTarget
    tgt = ProductionTarget(adapter=adapter, device=device)
    f_arch = tgt.arch or "sm90"
    prob = judge.dense_problem(q, k, v, arch=f_arch, dtype=dtype, causal=causal)
    a = judge.arrays_from(q, k, v, do)
    f = tgt.forward(prob, a)
    arch = _arch_of(SimpleNamespace(**tgt.last_config)) if tgt.last_config else f_arch
    g = tgt.backward(prob, a, f, deterministic=True) if backward else None
    return tgt, arch, f, g


def production_forward_case(adapter, dist: str, *, hdim: int, seqlen: int, causal: bool, nheads: int,
                            dtype: str = "bf16", seed: int = 0, device: str = "cuda") -> tuple[ForwardCheck, str]:
    """Production FA4 (or a stand-in adapter) on :func:`gen_inputs` data through
    :class:`fa4verify.targets.ProductionTarget`, its output and LSE judged against the composed
    forward budget.  Returns ``(check, arch)``; the check's ``where`` names the GPU."""
    q, k, v = gen_inputs(dist, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, nheads=nheads, hdim=hdim,
                         dtype=dtype, seed=seed)
    tgt, arch, f, _ = _production_run(adapter, q, k, v, None, causal=causal, dtype=dtype, device=device,
                                      backward=False)
    fc = check_forward_outputs(f.out, f.lse, q, k, v, arch=arch, dtype=dtype, causal=causal, where=tgt.where)
    return fc, arch


def production_backward_case(adapter, dist: str, *, hdim: int, seqlen: int, causal: bool, nheads: int,
                             dtype: str = "bf16", seed: int = 0, device: str = "cuda") -> tuple[BackwardCheck, str]:
    """The same for FA4's deterministic backward: dQ, dK, dV judged against the exact gradient
    within the composed backward budgets.  Returns ``(check, arch)``."""
    q, k, v, do = gen_inputs(dist, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, nheads=nheads, hdim=hdim,
                             dtype=dtype, seed=seed, with_dout=True)
    tgt, arch, _, g = _production_run(adapter, q, k, v, do, causal=causal, dtype=dtype, device=device,
                                      backward=True)
    bc = check_backward_outputs(g.dq, g.dk, g.dv, q, k, v, do, arch=arch, dtype=dtype, causal=causal,
                                where=tgt.where)
    return bc, arch


@dataclass(frozen=True)
class AttributionRow:
    """Forward error attributed to one stage ("CPU twin").

    ``isolated_rms``/``isolated_max``: error of the output with only this stage as FA4 (all
    others exact), absolute, vs the exact attention; ``ablation_drop_rms``: RMS error of the full
    as-FA4 run minus that with only this stage exact; ``lse_*`` the same for the LSE."""
    stage: str
    isolated_rms: float
    isolated_max: float
    ablation_drop_rms: float
    lse_isolated_max: float


def attribute_forward(q, k, v, *, arch: str, dtype: str = "bf16", causal=False,
                      window_size=(None, None), softmax_scale=None,
                      stages: Sequence[str] = ATTRIBUTION_STAGES,
                      accumulation="exact-then-round", mufu="correctly-rounded",
                      seed: int = 0) -> tuple[list[AttributionRow], dict]:
    """Stage attribution of the forward error by isolation and ablation (CPU twin).

    Returns the rows and a summary dict: ``full_rms``, ``full_max`` (the as-FA4 output error),
    ``dominant`` (stage with the largest isolated RMS) and ``emu_over_pcast`` (isolated RMS of
    ``exp2_emu`` divided by that of ``p_cast``; the expectation to test is < 1/40).
    """
    from fa4verify.kernels.twin import attention as ta
    ALL = frozenset(ta.FWD_STAGES)
    kw = dict(arch=arch, dtype=dtype, causal=causal,
              window_size=window_size, softmax_scale=softmax_scale, accumulation=accumulation,
              mufu=mufu, seed=seed)
    ref = ta.forward(q, k, v, exact_stages=ALL, **kw)
    ro, rl = np.asarray(ref.out, F64), np.asarray(ref.lse, F64)
    fin = np.isfinite(rl)

    def errs(r):
        e = np.abs(np.asarray(r.out, F64) - ro)
        le = np.abs(np.asarray(r.lse, F64) - rl)[fin]
        return float(np.sqrt(np.mean(e * e))), float(e.max(initial=0)), float(le.max(initial=0))
    full = ta.forward(q, k, v, **kw)
    f_rms, f_max, f_lmax = errs(full)
    rows = []
    for s in stages:
        iso = ta.forward(q, k, v, exact_stages=ALL - {s}, **kw)
        i_rms, i_max, i_lmax = errs(iso)
        abl = ta.forward(q, k, v, exact_stages={s}, **kw)
        a_rms, _, _ = errs(abl)
        rows.append(AttributionRow(s, i_rms, i_max, f_rms - a_rms, i_lmax))
    by = {r.stage: r for r in rows}
    dom = max(rows, key=lambda r: r.isolated_rms).stage if rows else ""
    pc = by.get("p_cast")
    em = by.get("exp2_emu")
    summary = {"full_rms": f_rms, "full_max": f_max, "full_lse_max": f_lmax, "dominant": dom,
               "emu_over_pcast": (em.isolated_rms / pc.isolated_rms)
               if (pc and em and pc.isolated_rms > 0) else float("nan"),
               "emulated_fraction": full.stages["emulated_fraction"]}
    return rows, summary


def fwd_bwd_p_mismatch(q, k, v, dout, *, arch: str = "sm100", dtype: str = "bf16",
                       causal=False, softmax_scale=None, seed: int = 0) -> dict:
    """SM100: the forward P (polynomial exp2 on emulated columns) vs the backward's recomputed P
    (hardware exp2 only), and the effect on the gradients ("CPU twin").

    * ``p_rel_max``: max over emulated columns of |P_fwd - P_bwd| / P_bwd, where both are
      computed from the same exponent argument (the backward's), i.e. the emulation error the
      backward does not see (<= ~8.8e-5 expected).
    * ``grad_effect_{dq,dk,dv}``: max |g(emulating forward) - g(non-emulating forward)| /
      max |g|: the gradient change caused by the forward's emulation (through LSE and O/D),
      on the fp32 gradients before the final cast.
    * ``grad_error_{dq,dk,dv}``: max |g(twin, fp32) - g(exact)| / max |g| for scale.
    * ``grad_effect_rms_share_{dq,dk,dv}``: rms of the effect / rms of the fp32 gradient error.
    * ``grad_effect_via_lse_rms_share_*`` / ``grad_effect_via_o_rms_share_*``: the same with only
      the LSE (resp. only the rounded O) taken from the emulating forward.
    """
    from fa4verify.kernels.twin import attention as ta
    from fa4verify.kernels.twin.forward import emulated_exp2
    kw = dict(arch=arch, dtype=dtype, causal=causal, softmax_scale=softmax_scale, seed=seed)
    fr = ta.forward(q, k, v, **kw)
    emu = fr.stages["emulated_columns"]
    # P mismatch on the backward's own arguments
    cap = {}

    def probe(s):
        if s.stage == "bwd_exp2":
            cap.setdefault("x", []).append(np.asarray(s.fa4))
    xs = []

    def probe_x(s):
        if s.stage == "bwd_exp_arg":
            xs.append(np.asarray(s.fa4, np.float32))
    g = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, stage_probe=probe_x, **kw)
    p_rel = 0.0
    n_cmp = 0
    tile = g.stages["tile_n"]
    for x in xs:
        ncol = x.shape[-1]
        em = np.resize(emu, ncol) if len(emu) == tile else np.zeros(ncol, bool)
        xe = np.ascontiguousarray(x[..., em])
        ok = np.isfinite(xe) & (xe > -126)
        if not ok.any():
            continue
        pf = emulated_exp2(xe).astype(F64)
        pb = ta.Mufu("correctly-rounded", 0).ex2(xe).astype(F64)
        rel = np.abs(pf - pb)[ok] / pb[ok]
        p_rel = max(p_rel, float(rel.max()))
        n_cmp += int(ok.sum())
    # effect on the gradients, measured on the fp32 gradients (final casts exact) so that bf16
    # rounding flips do not masquerade as an effect
    fr_noemu = ta.forward(q, k, v, exact_stages={"exp2_emu"}, **kw)
    gc = frozenset({"grad_cast"})
    g1 = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, exact_stages=gc, **kw)
    g2 = ta.backward(q, k, v, fr_noemu.out, dout, lse=fr_noemu.lse, exact_stages=gc, **kw)
    allx = frozenset(ta.FWD_STAGES)
    fre = ta.forward(q, k, v, exact_stages=allx, **kw)
    ge = ta.backward(q, k, v, fre.out, dout, lse=fre.lse, exact_stages=frozenset(ta.BWD_STAGES), **kw)
    out = {"p_rel_max": p_rel, "n_emulated_compared": n_cmp,
           "emulated_fraction": fr.stages["emulated_fraction"]}
    for n in ("dq", "dk", "dv"):
        a, b, e = (np.asarray(getattr(x, n), F64) for x in (g1, g2, ge))
        scale = max(np.abs(e).max(initial=0), 1e-300)
        out[f"grad_effect_{n}"] = float(np.abs(a - b).max(initial=0) / scale)
        out[f"grad_error_{n}"] = float(np.abs(a - e).max(initial=0) / scale)
        err_rms = float(np.sqrt(np.mean((a - e) ** 2)))
        out[f"grad_effect_rms_share_{n}"] = float(np.sqrt(np.mean((a - b) ** 2)) / err_rms) \
            if err_rms > 0 else 0.0
    # decomposition: the emulation reaches the backward through the LSE (P recompute) and
    # through the rounded O (D = rowsum(dO * O))
    g_lse = ta.backward(q, k, v, fr_noemu.out, dout, lse=fr.lse, exact_stages=gc, **kw)
    g_o = ta.backward(q, k, v, fr.out, dout, lse=fr_noemu.lse, exact_stages=gc, **kw)
    for n in ("dq", "dk", "dv"):
        b, e = np.asarray(getattr(g2, n), F64), np.asarray(getattr(ge, n), F64)
        err_rms = float(np.sqrt(np.mean((np.asarray(getattr(g1, n), F64) - e) ** 2))) or 1.0
        for tag, gg in (("via_lse", g_lse), ("via_o", g_o)):
            d = np.asarray(getattr(gg, n), F64) - b
            out[f"grad_effect_{tag}_rms_share_{n}"] = float(np.sqrt(np.mean(d * d)) / err_rms)
    return out
