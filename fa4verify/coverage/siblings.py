"""Note [Judged siblings]: a sibling call for each planned backward whose gradients a known FA4
defect absorbs by its configuration alone.

Note [Judged siblings]
----------------------
A known issue absorbs only the violations its model explains (Note [Known issues with a model],
``fa4verify/fuzz/defect_models.py``); where the model does not reach a call it absorbs by its
configuration, and then nothing else in those gradients is judged. Red-team round 17
(``docs/results/redteam17/``) found such calls at seed 0 whose feature combination no other call
judges: GQA backwards at the head dims of the SM90 accumulator defect (8, 72, 104: dK / dV whole, dQ
past row 64) with used-length Q or K or block sparsity, where the misread map does not reach
(``defect_models._misread_map``), and a dense call at FA4's 80-row tile with ``head_dim_v`` 64 and two
(batch, head) pairs, where the preprocess overrun races (known issue ``sm90_bwd_preprocess_overrun``).

By construction, not by what a seed drew: for every such call of the plan (rows, edges and kernel
variants) :func:`judged_siblings` adds a sibling that keeps everything but what puts it under the
issue -- the nearest head-dim class of the space with the same backward tile (and block where
block-sparse) outside the accumulator defect, or one (batch, head) pair at the overrun's tile -- so
the feature combination is judged in full. The original call stays (its forward, its dsink and
what the issue's model does judge). SM90 only (the defects are SM90's); a call none of whose
siblings the space holds is listed as such (``unjudged``).
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["judged_siblings", "configuration_only"]


def _window(problem: Any) -> tuple[bool, bool]:
    from fa4verify.problem import resolve_window
    causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
    return bool(causal), bool(local)


def _accum_defect(problem: Any, hd: int, hdv: int) -> bool:
    """Whether FA4 4.0.0b36's SM90 accumulator roundings differ at ``(hd, hdv)`` (the installed
    release and the pinned one: what the known issues absorb)."""
    from fa4verify.kernels import fa4_params
    causal, local = _window(problem)
    r = fa4_params.sm90_dq_accum_mismatch(hd, hdv, causal=causal, local=local)
    return bool(r.get("mismatch") and r.get("pinned_mismatch"))


def _bwd_block(problem: Any, hd: int, hdv: int) -> tuple[int, int]:
    """The backward's tile at ``(hd, hdv)``, or its block where the call is block-sparse."""
    from fa4verify.kernels import facts
    if problem.call is not None and problem.call.block_size is not None:
        from fa4verify.coverage.cases import sparse_block_size
        return tuple(sparse_block_size(problem.arch, hd, hdv))
    causal, local = _window(problem)
    return tuple(facts.sm90_bwd_tile(hd, hdv, causal, local))


def configuration_only(problem: Any) -> Optional[str]:
    """Which known issue absorbs gradients of ``problem``'s backward by its configuration alone
    ("accumulator": the SM90 dQ / GQA dK-dV issues where the misread map does not reach;
    "overrun": the preprocess overrun's race), or None."""
    from fa4verify.fuzz import defect_models
    from fa4verify.fuzz.known_issues import sm90_overrun_tile
    if problem.arch != "sm90":
        return None
    if _accum_defect(problem, problem.head_dim, problem.head_dim_v):
        gqa = problem.nheads_kv < problem.nheads
        if defect_models._misread_map(problem, "q") is None or (gqa and defect_models.sm90_dkv_misread(
                problem, {}, None, None) is None):
            return "accumulator"
    if sm90_overrun_tile(problem) and not problem.varlen and problem.batch * problem.nheads >= 2:
        return "overrun"
    return None


def _sibling(space: Any, problem: Any, why: str) -> Optional[Any]:
    if why == "overrun":
        # one head per KV head (a GQA group races too); not where a deployment fixes the head counts
        if problem.nheads_kv != problem.nheads or space.heads:
            return None
        try:
            return problem.replace(batch=1, nheads=1, nheads_kv=1)
        except ValueError:
            return None
    want = _bwd_block(problem, problem.head_dim, problem.head_dim_v)
    cands = sorted(space.hd.values(), key=lambda d: (abs(d[0] - problem.head_dim), d))
    for hd, hdv in cands:
        if (hd, hdv) == (problem.head_dim, problem.head_dim_v) or _accum_defect(problem, hd, hdv):
            continue
        if (hdv == hd) != (problem.head_dim_v == problem.head_dim) or _bwd_block(problem, hd, hdv) != want:
            continue
        try:
            return problem.replace(head_dim=hd, head_dim_v=hdv)
        except ValueError:
            continue
    return None


def judged_siblings(space: Any, cases: list[tuple[str, Any, bool, bool]]
                    ) -> tuple[list[tuple[str, Any, bool, bool]], list[str]]:
    """``(siblings, unjudged)``: for each backward case ``(name, problem, backward, deterministic)``
    that :func:`configuration_only` names, ``("judged_<name>", sibling, True, deterministic)``
    (one per distinct sibling); ``unjudged``: the names of such cases the space holds no sibling
    for."""
    out: list[tuple[str, Any, bool, bool]] = []
    unjudged: list[str] = []
    seen: set = set()
    if space.arch != "sm90":
        return out, unjudged
    for name, p, backward, det in cases:
        if not backward:
            continue
        why = configuration_only(p)
        if why is None:
            continue
        s = _sibling(space, p, why)
        if s is None:
            unjudged.append(name)
            continue
        key = (s.to_json(), det)
        if key in seen:
            continue
        seen.add(key)
        out.append((f"judged_{name}", s, True, det))
    return out, unjudged
