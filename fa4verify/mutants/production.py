"""The production column of the mutant suite: the knob-expressed faults run through FA4 itself
(:class:`fa4verify.targets.ProductionTarget`) on the local GPU."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from fa4verify.mutants.catalogue import Mutant
from fa4verify.mutants.problems import Problem, ProblemData
from fa4verify.mutants.twin_runs import TwinOutputs, _one_line
from fa4verify.errors import DependencyMissing
from fa4verify.mutants.columns import kernel_config, verifiers as _verifiers

#: Verifiers that apply to production kernels: those whose ``judges`` is "production" (no stage
#: probes, no exp2 emulation on SM90, no bit comparison with the twin).
PRODUCTION_VERIFIERS = tuple(s.name for s in _verifiers() if s.judges == "production")


#: torch device of the production target (tests swap in "cpu" with a fake adapter).
PRODUCTION_DEVICE = "cuda"


def production_applies(m: Mutant, p: Problem) -> bool:
    """Where a knob-expressed fault changes anything (and can be run through FA4's API)."""
    if m.name in ("causal_top_left", "causal_off_by_one"):
        return p.causal
    if m.name == "tail_tile_dropped":
        return not p.causal and p.kind != "nan"
    if m.name == "dq_shuffled_order":
        return p.bwd
    return False


def production_arch() -> str:
    """``"sm90"`` / ``"sm100"`` / ``"sm103"`` for the local GPU (raises :class:`DependencyMissing`
    without one, or on a GPU FA4 runs no SM90/SM100 kernel on)."""
    from fa4verify.kernels import adapter
    ok, why = adapter.cuda_status()
    if not ok:
        raise DependencyMissing(f"no CUDA device: {why}")
    from fa4verify.kernels.device import local_gpu
    g = local_gpu()
    if g is None:
        raise DependencyMissing("no CUDA device")
    if g.arch is None:
        raise DependencyMissing(g.unsupported_reason())
    return g.arch


def run_production(data: ProblemData, arch: str, mutations: Iterable[str] = (), *,
                   bwd: bool = True, repeat_bwd: int = 0, **_: Any) -> TwinOutputs:
    """Run production FA4 (through :class:`fa4verify.targets.ProductionTarget`) on ``data``, with at most one
    knob-expressed fault (:data:`PRODUCTION_KNOBS`):

    * ``causal_top_left``: ``causal=False, window_size=(None, seqlen_q - seqlen_k)`` (key j
      visible iff j <= i: FA4's bottom-right window shifted to the top-left);
    * ``causal_off_by_one``: ``causal=False, window_size=(None, 1)``;
    * ``tail_tile_dropped``: K and V truncated to ``seqlen_k`` rounded down to the KV tile (what
      ``seqused_k`` does; non-causal problems only); dK, dV of the dropped keys reported as 0;
    * ``dq_shuffled_order``: the backward with ``deterministic=False`` (unordered fp32
      reduce-adds into dQ).
    The backward is ``deterministic=True`` otherwise. Arrays come back as float32."""
    from fa4verify import judge
    from fa4verify.kernels import adapter
    from fa4verify.targets import ProductionTarget
    p = data.problem
    muts = set(mutations)
    res = TwinOutputs()
    dev = PRODUCTION_DEVICE
    causal, window, keep = p.causal, (None, None), p.seqlen_k
    if "causal_top_left" in muts:
        causal, window = False, (None, p.seqlen_q - p.seqlen_k)
    if "causal_off_by_one" in muts:
        causal, window = False, (None, 1)
    if "tail_tile_dropped" in muts:
        tile_n = int(kernel_config(p, arch)["tile_n"])
        keep = (p.seqlen_k // tile_n) * tile_n
    k, v = data.k[:, :keep], data.v[:, :keep]
    # the one target layer: production on the local GPU (a stand-in adapter on the CPU in tests)
    tgt = ProductionTarget() if dev == "cuda" else ProductionTarget(adapter=adapter, device=dev)
    prob = judge.dense_problem(data.q, k, v, arch=arch, dtype=p.dtype, causal=causal,
                               window_size=window, softmax_scale=p.softmax_scale)
    a = judge.arrays_from(data.q, k, v, data.dout)
    try:
        f = tgt.forward(prob, a)
        res.out = f.out.astype(np.float32)
        res.lse = f.lse.astype(np.float32)
    except Exception as exc:  # noqa: BLE001
        res.error = _one_line(exc)
        return res
    if not bwd:
        return res
    det = "dq_shuffled_order" not in muts

    def _grads():
        g = tgt.backward(prob, a, f, deterministic=det)
        out = []
        for arr, full in ((g.dq, p.seqlen_q), (g.dk, p.seqlen_k), (g.dv, p.seqlen_k)):
            arr = arr.astype(np.float32)
            if arr.shape[1] < full:  # dropped keys: no gradient written
                pad = np.zeros(arr.shape[:1] + (full - arr.shape[1],) + arr.shape[2:], np.float32)
                arr = np.concatenate([arr, pad], axis=1)
            out.append(arr)
        return tuple(out)
    try:
        res.grads = _grads()
        if repeat_bwd:
            res.grads_again = [_grads() for _ in range(int(repeat_bwd))]
    except Exception as exc:  # noqa: BLE001
        res.bwd_error = _one_line(exc)
    return res
