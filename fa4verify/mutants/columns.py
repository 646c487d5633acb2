"""The columns of the detection table: fa4verify's own problem-level verifiers (end-to-end budgets
through the judge, per-stage budgets, determinism), the field rules' adapters and the registry.

Each problem-level verifier is ``fn(env, run) -> Verdict`` where ``env`` is the per-problem cache
(:class:`ProblemEnv`) holding the unmutated twin's run, the oracle and the upstream references;
each global verifier (exp2) is ``fn(mutant_or_None, profile) -> Verdict``."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import numpy as np

from fa4verify.stages import budgets as stages
from fa4verify.mutants.catalogue import Arch
from fa4verify.mutants.exp2_verifiers import _bits_equal, _v_exp2_cert, _v_exp2_golden
from fa4verify.mutants.problems import Problem, ProblemData
from fa4verify.mutants.twin_runs import TwinOutputs, _one_line
from fa4verify.mutants.upstream import (_torch, assert_close_verdict, fa_rule_backward, fa_rule_forward,
                                        upstream_bwd_applies, UpstreamRefs, upstream_refs)
from fa4verify.mutants.verdict import NA, Verdict
from fa4verify.errors import DependencyMissing

@dataclasses.dataclass
class ProblemEnv:
    """Per-(problem, arch) cache shared by the verifiers."""

    data: ProblemData
    arch: Arch
    base: TwinOutputs
    refs: UpstreamRefs | None = None
    oracle_fwd: Any = None
    oracle_error: str | None = None
    budgets: Any = None

    def upstream(self) -> UpstreamRefs:
        """The upstream references (computed on first use: torch autograd is the costly part)."""
        if self.refs is None:
            p = self.data.problem
            self.refs = upstream_refs(self.data, with_grads=p.bwd and p.dtype != "fp8")
        return self.refs


def _oracle_module():
    from fa4verify.oracles import attention
    return attention


_BUDGET_CACHE: dict[tuple[str, str], Any] = {}


def load_budgets(dtype: str, arch: str):
    """``fa4verify.error_budgets.load(dtype, arch)`` (cached); raises :class:`DependencyMissing` when
    the budgets cannot be loaded (module missing or a malformed budget file)."""
    key = (dtype, arch)
    if key not in _BUDGET_CACHE:
        from fa4verify.error_budgets import load
        try:
            _BUDGET_CACHE[key] = load(dtype, arch)
        except Exception as exc:  # noqa: BLE001
            raise DependencyMissing(f"error budgets for {dtype}/{arch} not loadable: "
                              f"{_one_line(exc)}") from None
    return _BUDGET_CACHE[key]


def _v_stages(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """Every forward stage of the twin run within its local budget (``[stage.*]`` entries of
    ``error_budgets/<dtype>_<arch>.toml``), checked on every application through the twin's
    ``stage_probe``. Figure: the largest error/budget over all stages."""
    if run.stage_tally is None:
        return NA
    if run.stage_error:
        return Verdict("error", None, run.stage_error)
    if not run.stage_tally:
        return NA
    name, worst = max(run.stage_tally.items(), key=lambda kv: kv[1].max_ratio)
    over = {k: t.n_over for k, t in run.stage_tally.items() if t.n_over}
    if over:
        return Verdict("fail", worst.max_ratio,
                       f"{sum(over.values())} elements over budget in {sorted(over)}; worst "
                       f"{worst.worst}")
    unj = {k: t.n_unjudged for k, t in run.stage_tally.items() if t.n_unjudged}
    if unj:
        return Verdict("undecided", worst.max_ratio, f"stage budgets negative or non-finite on {unj} elements")
    return Verdict("pass", worst.max_ratio, f"all stages within budget; tightest {worst.worst}")


# ------------------------------------------------------------- end-to-end verifiers (oracle)
def kernel_config(p: Problem, arch: str) -> dict[str, float]:
    """FA4 facts for ``p`` on ``arch``: KV tile width, max_offset and rescale threshold (log2
    units), from :func:`fa4verify.kernels.facts.kernel_constants` (the installed FA4)."""
    from fa4verify.kernels import facts
    kc = facts.kernel_constants(arch, p.dtype, p.head_dim, p.head_dim, p.causal, False)
    return {"tile_n": float(kc.tile_n), "max_offset": kc.max_offset, "threshold": kc.rescale_threshold}


@dataclasses.dataclass
class OracleHead:
    """One head of an :class:`OracleCase`: its inputs (keys dropped per Note [NaN in emulated
    lanes]) and the oracle forward on them."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    fwd: Any


@dataclasses.dataclass
class OracleCase:
    """The oracle forward for one (problem, arch) under FA4's NaN semantics, per head."""

    heads: list[OracleHead]
    dropped_keys: tuple[int, ...]

    @property
    def out(self) -> np.ndarray:
        return np.concatenate([h.fwd.out for h in self.heads], axis=2)

    @property
    def lse(self) -> np.ndarray:
        return np.concatenate([h.fwd.lse for h in self.heads], axis=1)


def oracle_case(data: ProblemData, arch: str) -> OracleCase:
    """The oracle forward for ``data`` as FA4 on ``arch`` must compute it.

    Note [NaN in emulated lanes]: FA4's polynomial exp2 maps a NaN exponent argument to +0
    (``fmax(NaN, -127) = -127``, Note [exp2 emulation]), so on SM100 a key whose score is NaN
    only in *emulated* columns (``twin.emulated_columns``, key index mod 128) contributes P = 0:
    it is as if that key were masked. A NaN in a MUFU column propagates to the row (O = NaN).
    fa4verify's judge encodes this documented contract (flash_attn/cute/utils.py:786 ex2_emulation): for SM100,
    keys whose K row holds a NaN in an emulated column are removed, per head, before the oracle
    runs (non-causal problems only: removing a key would shift the bottom-right causal
    alignment); every other NaN follows the oracle's Note [Oracle NaN policy] (NaN output).
    """
    orc = _oracle_module()
    p = data.problem
    q, k, v = data.q, data.k, data.v
    dropped: list[int] = []
    if arch != "sm90" and not np.isfinite(k).all():
        if p.causal:
            raise ValueError("NaN keys with causal masking: Note [NaN in emulated lanes] needs "
                             "a non-causal problem")
        from fa4verify.kernels.twin import emulated_columns
        emu = emulated_columns(head_dim=p.head_dim, causal=p.causal, fp8=(p.dtype == "fp8"),
                               pack_gqa=False)
        bad_keys = np.flatnonzero(~np.isfinite(k).all(axis=(0, 2, 3)))
        dropped = [int(j) for j in bad_keys if emu[j % emu.size]]
    heads = []
    for hh in range(q.shape[2]):
        keep = np.ones(k.shape[1], bool)
        for j in dropped:
            if not np.isfinite(k[:, j, hh, :]).all():
                keep[j] = False
        qh, kh, vh = q[:, :, hh:hh + 1], k[:, keep, hh:hh + 1], v[:, keep, hh:hh + 1]
        heads.append(OracleHead(qh, kh, vh, orc.forward(qh, kh, vh, softmax_scale=p.softmax_scale,
                                                       causal=p.causal)))
    return OracleCase(heads, tuple(dropped))


def _env_oracle(env: "ProblemEnv") -> OracleCase:
    if env.oracle_fwd is None and env.oracle_error is None:
        try:
            env.oracle_fwd = oracle_case(env.data, env.arch)
        except DependencyMissing:
            raise
        except Exception as exc:  # noqa: BLE001
            env.oracle_error = _one_line(exc)
    if env.oracle_error:
        raise RuntimeError(env.oracle_error)
    return env.oracle_fwd


def _v_fwd_budget(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """Forward output and LSE vs the certified oracle within the composed budget
    (``e2e.forward_out`` and ``e2e.forward_lse``).

    Finite inputs: fa4verify's judge (``judge.judge_forward``). Inputs with NaN: the same judge
    per head under FA4's NaN semantics (Note [NaN in emulated lanes]) with NaN locations judged
    (``nan="match"``). ``tests/test_mutants_e2e.py`` checks that both paths give the same
    verdicts on the finite battery problems."""
    if run.out is None:
        return NA
    p = env.data.problem
    budgets = load_budgets(p.dtype, env.arch)
    d = env.data
    if np.isfinite(d.q).all() and np.isfinite(d.k).all() and np.isfinite(d.v).all():
        return _fwd_budget_judge(env, run, budgets)
    return _fwd_budget_own(env, run, budgets)


def _judge_verdict(verdicts, label: str, extra: str = "") -> Verdict:
    """The judge's verdicts on several tensors as one mutant-table verdict."""
    from fa4verify.judge import combine
    st = combine(verdicts)
    fig = max((v.tightness for v in verdicts), default=0.0)
    parts = [f"{v.name} {v.tightness:.3g} ({v.n_over} over" + (f", {v.n_unjudged} unjudged" if v.n_unjudged else "")
             + ")" for v in verdicts]
    worst = max(verdicts, key=lambda v: v.tightness)
    why = next((v.reason for v in verdicts if v.status == "undecided"), "")
    return Verdict(st, fig, f"{label}: " + ", ".join(parts) + extra
                   + (f"; worst {worst.worst.text()}" if worst.worst is not None else "")
                   + (f"; undecided: {why}" if st == "undecided" else ""))


def _fwd_budget_judge(env: "ProblemEnv", run: "TwinOutputs", budgets) -> Verdict:
    """fa4verify's judge (``fa4verify.judge.judge_forward``), finite inputs."""
    p = env.data.problem
    d = env.data
    with np.errstate(invalid="ignore"):
        fc = stages.check_forward_outputs(
            run.out, run.lse, d.q, d.k, d.v, arch=env.arch, dtype=p.dtype,
            softmax_scale=p.softmax_scale, causal=p.causal, budgets=budgets, where="CPU twin")
    return _judge_verdict(fc.verdicts, "judge.judge_forward", f"; max |err| {fc.max_abs_err:.3g}")


def _fwd_budget_own(env: "ProblemEnv", run: "TwinOutputs", budgets) -> Verdict:
    """The judge per head, on the oracle of FA4's NaN semantics (Note [NaN in emulated lanes]),
    with NaN locations judged (``nan="match"``: where the oracle is NaN the output must be
    non-finite; FA4 writes LSE = -inf for a row whose sum is NaN, flash_attn/cute/softmax.py:253 Softmax.finalize)."""
    from fa4verify import judge
    oc = _env_oracle(env)
    p = env.data.problem
    verdicts = []
    for hh, head in enumerate(oc.heads):
        prob = judge.dense_problem(head.q, head.k, head.v, arch=env.arch, dtype=p.dtype, causal=p.causal,
                                   softmax_scale=p.softmax_scale)
        a = judge.arrays_from(head.q, head.k, head.v)
        lse = None if run.lse is None else run.lse[:, hh:hh + 1]
        with np.errstate(invalid="ignore", over="ignore"):
            j = judge.judge_forward(prob, a, run.out[:, :, hh:hh + 1], lse, budgets=budgets,
                                    oracle=head.fwd, nan="match")
        verdicts += [dataclasses.replace(j.out, name=f"out[h{hh}]"), dataclasses.replace(j.lse, name=f"lse[h{hh}]")]
    return _judge_verdict(verdicts, "judge.judge_forward per head",
                          f"; dropped NaN keys {list(oc.dropped_keys)}")


def _v_bwd_budget(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """dQ, dK, dV vs the certified oracle within ``e2e.backward_dq/dk/dv``: fa4verify's judge,
    ``stages.check_backward_outputs`` (reference: the exact gradient; the budget's D term
    covers D computed from the rounded O). Finite inputs only (the battery's NaN problems have no
    backward)."""
    if _bwd_error(run):
        return _bwd_error(run)  # type: ignore[return-value]
    if run.grads is None:
        return NA
    d = env.data
    p = d.problem
    if not (np.isfinite(d.q).all() and np.isfinite(d.k).all() and np.isfinite(d.v).all()):
        return NA
    budgets = load_budgets(p.dtype, env.arch)
    with np.errstate(invalid="ignore", over="ignore"):
        bc = stages.check_backward_outputs(
            run.grads[0], run.grads[1], run.grads[2], d.q, d.k, d.v, d.dout, arch=env.arch,
            dtype=p.dtype, causal=p.causal, softmax_scale=p.softmax_scale,
            budgets=budgets, where="CPU twin")
    return _judge_verdict(bc.verdicts, "judge.judge_backward")


def _det_tensors(grads, acc):
    names = ("dq", "dk", "dv", "dq_accum")
    ts = list(grads) + [acc]
    return [(n, t) for n, t in zip(names, ts) if t is not None]


def _det_diff(a, b) -> int:
    from fa4verify import determinism as det
    torch = _torch()
    return det.compare_bitwise(torch.from_numpy(np.ascontiguousarray(a)),
                               torch.from_numpy(np.ascontiguousarray(b))).differing


def _v_determinism(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """fa4verify's determinism gate on the deterministic backward, run to run: repeated calls
    bitwise identical (``fa4verify.determinism.compare_bitwise``) -- what production's
    ``determinism.fa4`` checks on any GPU. On the twin the fp32 dQ accumulator
    (``stages["dq_accum"]``) is compared too (production: the dq_accum stage tap). Figure:
    differing elements. The comparison with a reference manifest is the ``manifest`` column."""
    if _bwd_error(run):
        return _bwd_error(run)  # type: ignore[return-value]
    if run.grads is None or run.grads_again is None:
        return NA
    first = dict(_det_tensors(run.grads, run.dq_accum))
    n_rerun: dict[str, int] = {}
    accs = run.dq_accum_again or [None] * len(run.grads_again)
    for again, acc in zip(run.grads_again, accs):
        for n, t in _det_tensors(again, acc):
            if n in first:
                n_rerun[n] = n_rerun.get(n, 0) + _det_diff(first[n], t)
    runs = 1 + len(run.grads_again)
    bad = {n: c for n, c in n_rerun.items() if c}
    if bad:
        what = "bf16 gradients identical, only the fp32 accumulator differs" \
            if set(bad) == {"dq_accum"} else "gradients differ"
        return Verdict("fail", sum(bad.values()),
                       f"not reproducible over {runs} deterministic backward calls: differing "
                       f"elements {bad} ({what})")
    return Verdict("pass", 0, f"{runs} deterministic backward calls bitwise identical "
                              f"({', '.join(first)})")


def _v_manifest(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """The deterministic backward's bits against a reference manifest: here the unmutated
    twin's deterministic order, applied only when the backward's inputs (O, LSE) are bitwise the
    same (for production: a manifest recorded on the same GPU/driver/versions, i.e. a regression
    check against a trusted build, not an accuracy judgement -- hence "bit comparison").
    Figure: differing elements."""
    if _bwd_error(run):
        return _bwd_error(run)  # type: ignore[return-value]
    if run.grads is None:
        return NA
    base = env.base
    first = dict(_det_tensors(run.grads, run.dq_accum))
    if run is base:
        return Verdict("pass", 0, "the reference itself")
    same_inputs = (base.out is not None and run.out is not None
                   and _bits_equal(run.out, base.out).all()
                   and (run.lse is None or base.lse is None or _bits_equal(run.lse, base.lse).all()))
    if not same_inputs or base.grads is None:
        return NA
    ref = dict(_det_tensors(base.grads, base.dq_accum))
    man = {n: _det_diff(t, ref[n]) for n, t in first.items() if n in ref}
    badm = {n: c for n, c in man.items() if c}
    if badm:
        return Verdict("fail", sum(badm.values()),
                       f"differs from the reference manifest (unmutated deterministic order): "
                       f"differing elements {badm}")
    return Verdict("pass", 0, "equal to the reference manifest")


#: tensors x problems the statistical column corrects its false-alarm rate for (Bonferroni:
#: 4 tensors x a battery of at most 64 problem-arch pairs)
_STAT_TESTS = 4 * 64


def _stat_oracles(env: "ProblemEnv"):
    """The oracle forward and backward of the problem (computed once per problem)."""
    c = getattr(env, "_stat_oracles", None)
    if c is None:
        from fa4verify.judge import attention as ja
        d = env.data
        p = d.problem
        prob = ja.dense_problem(d.q, d.k, d.v, arch=env.arch, dtype=p.dtype, causal=p.causal,
                                softmax_scale=p.softmax_scale)
        a = ja.arrays_from(d.q, d.k, d.v, d.dout)
        with np.errstate(invalid="ignore", over="ignore"):
            of = ja.oracle_forward(prob, a)
            ob = ja.oracle_backward(prob, a) if env.base.grads is not None else None
        c = (of, ob)
        env._stat_oracles = c  # type: ignore[attr-defined]
    return c


def _v_statistical(env: "ProblemEnv", run: "TwinOutputs") -> Verdict:
    """fa4verify's statistical tier (``fa4verify.judge.statistical.stat_compare``): the ulp-error
    distribution of out (and dq, dk, dv) against the oracle, compared with the prediction on the
    same inputs, which here is the unmutated twin (in production it is the twin too): bias
    intervals and a one-sided KS test over rows, Bonferroni over 4 tensors x the battery. Finite
    bf16/fp16 inputs only. Figure: the largest bias significance (> 1: the bias interval lies
    outside the margin)."""
    if run.out is None or env.base.out is None:
        return NA
    d = env.data
    p = d.problem
    if p.dtype not in ("bf16", "fp16") or not (np.isfinite(d.q).all() and np.isfinite(d.k).all()
                                               and np.isfinite(d.v).all()):
        return NA
    from fa4verify.judge import combine
    from fa4verify.judge.statistical import DEFAULT_ALPHA, alpha_per_test, stat_compare
    alpha = alpha_per_test(DEFAULT_ALPHA, _STAT_TESTS)
    of, ob = _stat_oracles(env)
    pairs = [("out", run.out, env.base.out, of.out)]
    if run.grads is not None and env.base.grads is not None and ob is not None and not run.bwd_error:
        pairs += [(n, g, b, getattr(ob, n)) for n, g, b in zip(("dq", "dk", "dv"), run.grads,
                                                                 env.base.grads)]
    vs = [stat_compare(n, a, pr, r, p.dtype, alpha_test=alpha) for n, a, pr, r in pairs]
    st = combine(vs)
    sig = [v.bias_significance for v in vs if np.isfinite(v.bias_significance)]
    why = "; ".join(f"{v.name}: {v.reason}" for v in vs if v.reason)
    return Verdict(st, max(sig) if sig else None,
                   f"statistical tier ({', '.join(v.name for v in vs)}, alpha/test {alpha:.2g})"
                   + (f": {why}" if why else ": bias and row-error distributions as predicted"))


# ============================================================================ verifier registry
@dataclasses.dataclass(frozen=True)
class VerifierSpec:
    """One column of the detection table. ``scope="problem"``: evaluated per (problem, arch)
    as ``fn(env, run) -> Verdict``; ``scope="exp2"``: evaluated once per polynomial mutant (and
    the unmutated twin) as ``fn(mutant_or_None, profile) -> Verdict``."""

    name: str
    group: Literal["fa4verify", "FA rule", "assert_close"]
    scope: Literal["problem", "exp2"]
    title: str
    fn: Callable[..., Verdict]
    #: what the verifier can judge (the honest headline): "production" --
    #: it reads only what a production kernel returns (outputs against the oracle, reruns,
    #: a manifest recorded on the same GPU); "twin only" -- it needs the twin's internals
    #: (stage hooks, the twin's own exp2 model); "bit comparison" -- it compares bits with
    #: the unmutated twin or recorded golden bits of the same function
    judges: Literal["production", "twin only", "bit comparison"] = "production"


def _v_fa_rule_fwd(env: ProblemEnv, run: TwinOutputs) -> Verdict:
    if run.out is None:
        return NA
    return fa_rule_forward(run.out, env.upstream())


def _bwd_error(run: TwinOutputs) -> Verdict | None:
    return Verdict("error", None, run.bwd_error) if run.bwd_error else None


def _v_fa_rule_bwd(env: ProblemEnv, run: TwinOutputs) -> Verdict:
    if _bwd_error(run):
        return _bwd_error(run)  # type: ignore[return-value]
    if run.grads is None or not upstream_bwd_applies(env.data.problem) \
            or env.upstream().grads_ref is None:
        return NA
    return fa_rule_backward(run.grads, env.upstream())


def _v_assert_close_fwd(env: ProblemEnv, run: TwinOutputs) -> Verdict:
    if run.out is None:
        return NA
    return assert_close_verdict(run.out, env.upstream().out_ref)


def _v_assert_close_bwd(env: ProblemEnv, run: TwinOutputs) -> Verdict:
    if _bwd_error(run):
        return _bwd_error(run)  # type: ignore[return-value]
    if run.grads is None or env.upstream().grads_ref is None:
        return NA
    return assert_close_verdict(list(run.grads), list(env.upstream().grads_ref))


_REGISTRY: list[VerifierSpec] = []


def _register(spec: VerifierSpec) -> VerifierSpec:
    _REGISTRY.append(spec)
    return spec


def verifiers() -> tuple[VerifierSpec, ...]:
    """All verifiers, fa4verify's first, in table order."""
    order = {"fa4verify": 0, "FA rule": 1, "assert_close": 2}
    return tuple(sorted(_REGISTRY, key=lambda s: order[s.group]))


# ====================================================================== register verifiers
_register(VerifierSpec("exp2_cert", "fa4verify", "exp2",
                       "exp2 certification: max rel. error vs certified bound, bf16 wrong count",
                       _v_exp2_cert, judges="twin only"))
_register(VerifierSpec("exp2_golden", "fa4verify", "exp2",
                       "bit-exact emulated exp2 vs the H200 golden bits (probe_outputs.npz)",
                       _v_exp2_golden, judges="bit comparison"))
_register(VerifierSpec("fwd_budget", "fa4verify", "problem",
                       "out and LSE vs the certified oracle within e2e.forward_out/forward_lse",
                       _v_fwd_budget))
_register(VerifierSpec("bwd_budget", "fa4verify", "problem",
                       "dq, dk, dv vs the certified oracle within e2e.backward_dq/dk/dv",
                       _v_bwd_budget))
_register(VerifierSpec("determinism", "fa4verify", "problem",
                       "deterministic backward: bitwise run-to-run",
                       _v_determinism))
_register(VerifierSpec("manifest", "fa4verify", "problem",
                       "deterministic backward vs the reference manifest (unmutated bits)",
                       _v_manifest, judges="bit comparison"))
_register(VerifierSpec("stages", "fa4verify", "problem",
                       "every forward stage within its local budget (twin stage probe)",
                       _v_stages, judges="twin only"))
_register(VerifierSpec("statistical", "fa4verify", "problem",
                       "statistical tier: ulp-error bias and row distributions vs the prediction",
                       _v_statistical))
# the field rules last: the table reads fa4verify | FA rule | assert_close
_register(VerifierSpec("fa_rule_fwd", "FA rule", "problem",
                       "upstream forward rule, test_flash_attn.py:462-463,513-515",
                       _v_fa_rule_fwd))
_register(VerifierSpec("fa_rule_bwd", "FA rule", "problem",
                       "upstream backward rule, test_flash_attn.py:601-618", _v_fa_rule_bwd))
_register(VerifierSpec("assert_close_fwd", "assert_close", "problem",
                       "torch.testing.assert_close defaults (bf16 rtol 1.6e-2, atol 1e-5) on out",
                       _v_assert_close_fwd))
_register(VerifierSpec("assert_close_bwd", "assert_close", "problem",
                       "torch.testing.assert_close defaults on dq, dk, dv", _v_assert_close_bwd))

VERIFIERS = _REGISTRY
