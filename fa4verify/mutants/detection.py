"""Which verifier catches which production fault: pluggable verifiers per tensor and the
detection curve over graded biases.

A verifier is ``fn(case: TensorCase) -> Outcome``; :data:`VERIFIERS` holds them in table order
and :func:`register_verifier` adds one (the statistical tier,
``fa4verify.judge.statistical``, plugs in here). Shipped:

* ``worst_case`` -- fa4verify's judge, :func:`fa4verify.judge.compare` against the oracle with
  the composed (or stage) budget: caught = "fail"; "undecided" is reported as undecided, never as
  caught or missed;
* ``statistical`` -- fa4verify's statistical tier (bias and distribution of the ulp error
  against the twin's prediction on the same inputs, ``case.extra["predicted"]``); n/a for
  tensors without a prediction (LSE, D, the dq_accum taps);
* ``fa_rule`` -- FlashAttention's upstream test rule ``max|x - ref| <= 2 max|pt - ref| + atol``
  (``fa4verify.mutants.fa_rule``), with the upstream references in the input dtype; it exists
  for out, dq, dk, dv only (n/a elsewhere);
* ``assert_close`` -- ``torch.testing.assert_close`` with its defaults against the oracle
  rounded to the tensor's dtype (bf16/fp16 outputs, fp32 for LSE, D, dq_accum).

``Outcome.status`` is one of "caught", "missed", "undecided", "n/a".
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

__all__ = ["TensorCase", "Outcome", "VERIFIERS", "register_verifier", "worst_case", "fa_rule_verifier",
           "assert_close_verifier", "statistical_verifier", "run_verifiers", "detection_curve", "TENSORS"]

TENSORS = ("out", "lse", "D", "lse_log2", "dq_accum", "dq", "dk", "dv")


@dataclasses.dataclass
class TensorCase:
    """One tensor of one run: the kernel's values and what each verifier needs."""

    name: str
    actual: np.ndarray
    ref: np.ndarray                 #: oracle value (float64)
    bound: Any                      #: oracle's certified bound
    budget: Any                     #: fa4verify's allowance (composed or stage)
    dtype: str                      #: "bf16", "fp16" or "fp32": the kernel tensor's dtype
    upstream_ref: Any = None        #: FA's out_ref / grad_ref (torch, input dtype) or None
    upstream_pt: Any = None         #: FA's out_pt / grad_pt or None
    extra: dict = dataclasses.field(default_factory=dict)   #: e.g. stats for other tiers


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str
    detail: str = ""

    def to_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail}


Verifier = Callable[[TensorCase], Outcome]


def worst_case(case: TensorCase) -> Outcome:
    from fa4verify.judge.verdict import compare
    v = compare(case.name, case.actual, case.ref, oracle_bound=case.bound, budget=case.budget)
    st = {"fail": "caught", "pass": "missed"}.get(v.status, "undecided")
    return Outcome(st, v.summary())


def fa_rule_verifier(case: TensorCase) -> Outcome:
    if case.upstream_ref is None or case.upstream_pt is None:
        return Outcome("n/a", "FA's upstream test has no rule for this tensor")
    import torch
    from fa4verify.mutants import fa_rule
    ref = case.upstream_ref
    act = torch.from_numpy(np.ascontiguousarray(case.actual, np.float32)).to(ref.dtype).reshape(ref.shape)
    r = fa_rule(act, ref, case.upstream_pt)
    return Outcome("missed" if r.passed else "caught",
                   f"max|x-ref|={r.diff_max:.3g} vs {r.rtol:g}*{r.diff_pt_max:.3g}+{r.atol:.3g}")


def assert_close_verifier(case: TensorCase) -> Outcome:
    import torch
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    act = torch.from_numpy(np.ascontiguousarray(case.actual, np.float32)).to(tdt)
    exp = torch.from_numpy(np.ascontiguousarray(case.ref, np.float64)).to(tdt)
    try:
        torch.testing.assert_close(act, exp)
    except AssertionError as e:
        first = str(e).strip().splitlines()
        return Outcome("caught", " ".join(x.strip() for x in first[:3]))
    return Outcome("missed", "within torch defaults")


def statistical_verifier(case: TensorCase) -> Outcome:
    """fa4verify's statistical tier (:func:`fa4verify.judge.statistical.stat_compare`): the
    tensor's ulp-error distribution against the twin's prediction on the same inputs
    (``case.extra["predicted"]``), at ``case.extra["alpha_test"]``; n/a without a prediction."""
    pred = case.extra.get("predicted")
    if pred is None:
        return Outcome("n/a", "no twin prediction for this tensor")
    from fa4verify.judge.statistical import stat_compare
    v = stat_compare(case.name, case.actual, pred, case.ref, case.dtype,
                     alpha_test=float(case.extra["alpha_test"]))
    st = {"fail": "caught", "pass": "missed"}.get(v.status, "undecided")
    return Outcome(st, v.reason or f"bias {v.bias_diff:+.3g} ulp vs twin, KS p {v.ks_p:.3g}")


#: name -> verifier, in table order
VERIFIERS: dict[str, Verifier] = {"worst_case": worst_case, "statistical": statistical_verifier,
                                  "fa_rule": fa_rule_verifier, "assert_close": assert_close_verifier}


def register_verifier(name: str, fn: Verifier, *, replace: bool = False) -> None:
    """Add a verifier column (ValueError if the name exists and not ``replace``)."""
    if name in VERIFIERS and not replace:
        raise ValueError(f"verifier {name!r} already registered")
    VERIFIERS[name] = fn


def run_verifiers(cases: Sequence[TensorCase], verifiers: Optional[Mapping[str, Verifier]] = None
                  ) -> dict[str, dict[str, dict]]:
    """``{tensor: {verifier: outcome dict}}``; a verifier that raises is reported "undecided"
    with the exception (never caught, never missed)."""
    vs = VERIFIERS if verifiers is None else verifiers
    res: dict[str, dict[str, dict]] = {}
    for c in cases:
        row = {}
        for n, fn in vs.items():
            try:
                row[n] = fn(c).to_dict()
            except Exception as e:  # noqa: BLE001 -- a verifier crash is a finding, not a verdict
                row[n] = Outcome("undecided", f"verifier raised {type(e).__name__}: {e}").to_dict()
        res[c.name] = row
    return res


def detection_curve(results: Mapping[str, Mapping], mutants: Sequence, family: str) -> dict:
    """For the graded ``family``: ``{tensor: {verifier: {"smallest_caught": bias or None,
    "monotone": bool, "caught": [biases]}}}``. ``results``: mutant id -> worker/judge record
    with ``"verdicts": {tensor: {verifier: outcome}}``. ``monotone`` is False when some larger
    bias of the family was missed while a smaller one was caught."""
    fam = sorted((m for m in mutants if m.family == family), key=lambda m: m.bias)
    out: dict[str, dict] = {}
    tensors: list[str] = []
    for m in fam:
        for t in (results.get(m.id) or {}).get("verdicts", {}):
            if t not in tensors:
                tensors.append(t)
    for t in tensors:
        row = {}
        names: list[str] = []
        for m in fam:
            for n in ((results.get(m.id) or {}).get("verdicts", {}).get(t) or {}):
                if n not in names:
                    names.append(n)
        for n in names:
            st = [((results.get(m.id) or {}).get("verdicts", {}).get(t, {}).get(n) or {}).get("status")
                  for m in fam]
            caught = [m.bias for m, s in zip(fam, st) if s == "caught"]
            smallest = min(caught) if caught else None
            mono = all(s == "caught" for m, s in zip(fam, st) if smallest is not None and m.bias >= smallest)
            applicable = any(s not in ("n/a", None) for s in st)
            row[n] = {"smallest_caught": smallest, "monotone": mono, "caught": caught,
                      "statuses": st, "applicable": applicable}
        out[t] = row
    return out


def fmt_bias(b: Optional[float]) -> str:
    if b is None:
        return "none"
    return f"2^{round(math.log2(b))}"
