"""Running the (mutated) CPU twin on one battery problem: forward, deterministic backward and its
repeats, and the per-stage local budget tally through the twin's stage probe."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import numpy as np

from fa4verify.mutants.catalogue import Arch
from fa4verify.mutants.problems import Problem, ProblemData
from fa4verify.stages.budgets import StageTally, stage_verdict, tally_verdict

def _call_accepting(fn: Callable, *args, required: Iterable[str] = (), **kwargs):
    """Call ``fn`` with only the keyword arguments its signature accepts. A keyword named in
    ``required`` that ``fn`` does not accept raises ``TypeError`` (never silently dropped)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    missing = [k for k in required if k in kwargs and k not in params]
    if missing:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} does not accept {missing}")
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


@dataclasses.dataclass
class TwinOutputs:
    """What one twin run produced (float32 arrays of dtype-rounded values), or ``error``."""

    out: np.ndarray | None = None
    lse: np.ndarray | None = None
    grads: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    grads_again: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    dq_accum: np.ndarray | None = None          # fp32 dQ accumulator (twin stage), unscaled
    dq_accum_again: list[np.ndarray | None] | None = None
    stages: Any = None
    bwd_stages: Any = None
    error: str | None = None
    bwd_error: str | None = None
    stage_tally: dict[str, "StageTally"] | None = None
    stage_error: str | None = None


def _one_line(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {msg}"[:300]


def _f32(a) -> np.ndarray | None:
    if a is None:
        return None
    if hasattr(a, "detach"):
        a = a.detach().cpu().float().numpy()
    return np.asarray(a, dtype=np.float32)


def _stage_collector(budgets, p: Problem, res: "TwinOutputs") -> Callable[[Any], None]:
    base = {"d": float(p.head_dim), "dv": float(p.head_dim)}

    def probe(sample) -> None:
        tally = res.stage_tally.setdefault(sample.stage, StageTally(sample.stage))  # type: ignore[union-attr]
        if sample.stage not in budgets:
            tally.no_budget = True
            tally.worst = tally.worst or f"no budget entry {sample.stage!r}"
            return
        try:
            v = stage_verdict(budgets, sample, base)
        except Exception as exc:  # noqa: BLE001 - a missing statistic is a broken check
            res.stage_error = f"stage {sample.stage}: {_one_line(exc)}"
            return
        tally_verdict(tally, v)
    return probe


def twin_module():
    """``fa4verify.kernels.twin.attention`` (a plain import: a broken twin is an error, not a skip)."""
    from fa4verify.kernels.twin import attention as twin_attention
    return twin_attention


def run_twin(data: ProblemData, arch: Arch, mutations: Iterable[str] = (), *,
             bwd: bool = True, repeat_bwd: int = 0,
             stage_budgets: Any = None) -> TwinOutputs:
    """Run the twin's forward (and backward, ``deterministic=True``) on ``data``.

    ``repeat_bwd`` more backward runs (for the run-to-run determinism check). Any
    exception is caught into ``TwinOutputs.error`` (one line), so one broken mutant cannot stop
    the suite. ``stage_budgets`` (a ``fa4verify.error_budgets`` BudgetSet): tally every forward
    stage application against its local budget (:class:`StageTally`)."""
    tw = twin_module()
    if tw is None:
        return TwinOutputs(error="fa4verify.kernels.twin.attention is not available")
    p = data.problem
    muts = frozenset(mutations)
    kw = dict(arch=arch, softmax_scale=p.softmax_scale, causal=p.causal, mutations=muts,
              dtype=p.dtype)
    res = TwinOutputs()
    fkw = dict(kw)
    if stage_budgets is not None:
        res.stage_tally = {}
        fkw["stage_probe"] = _stage_collector(stage_budgets, p, res)
    try:
        r = _call_accepting(tw.forward, data.q, data.k, data.v, required=("mutations",), **fkw)
    except Exception as exc:  # noqa: BLE001 - recorded as an "error" verdict
        res.error = _one_line(exc)
        return res
    res.out, res.lse, res.stages = _f32(r.out), _f32(getattr(r, "lse", None)), \
        getattr(r, "stages", None)
    if not bwd:
        return res
    back = getattr(tw, "backward", None)
    if back is None:
        res.bwd_error = "twin_attention.backward is not available"
        return res
    try:
        def _bwd():
            return _call_accepting(back, data.q, data.k, data.v, res.out, data.dout,
                                   lse=res.lse, deterministic=True, forward_result=r,
                                   required=("mutations",), **kw)
        def _acc(g):
            st = getattr(g, "stages", None) or {}
            return _f32(st.get("dq_accum")) if "dq_accum" in st else None
        g = _bwd()
        res.grads = (_f32(g.dq), _f32(g.dk), _f32(g.dv))
        res.bwd_stages = getattr(g, "stages", None)
        res.dq_accum = _acc(g)
        if repeat_bwd:
            res.grads_again = []
            res.dq_accum_again = []
            for _ in range(int(repeat_bwd)):
                g2 = _bwd()
                res.grads_again.append((_f32(g2.dq), _f32(g2.dk), _f32(g2.dv)))
                res.dq_accum_again.append(_acc(g2))
    except Exception as exc:  # noqa: BLE001
        res.bwd_error = _one_line(exc)
    return res
