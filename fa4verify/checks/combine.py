"""``production.combine``: FA4's public ``flash_attn_combine`` on the GPU it runs on.

FA4's SM90 forward has no split-KV (``interface.py``: "SplitKV not supported on SM 9.0"), so no
other check reaches ``flash_fwd_combine.py`` there; on SM100 the split-KV forward uses it
internally, and callers use it directly to merge the partial outputs of their own KV splits.

Note [Combine on the GPU]
-------------------------
A dense non-causal problem (2 x 256 x 4 x 128, seqlen_k 2048, seed 1: the shape of the features
run measured on the H200, session 5: ``docs/results/h200_session5/``) is cut into S contiguous key
chunks (:func:`fa4verify.judge.split_combine.split_problems`); FA4's forward runs on each chunk
(``return_lse``), FA4's combine merges the S partials (fp32 partials holding the forwards' bf16
outputs: what FA4's own split-KV path hands it; 16-bit partials are a recorded finding,
``docs/results/h200_session5/combine/``) and :func:`~fa4verify.judge.split_combine.judge_split_combine`
judges, through the one judge: every partial against its chunk's oracle (forward budget), the
combine stage against the exact combine of the same partials (``[stage.combine_out]`` /
``[stage.combine_lse]``), and the merged output against the *full* problem's oracle under the
composed budget (DERIVATIONS.md#combine). S = 3 and 8. The check's inputs are fixed (seed 1), so
a run is reproducible bit for bit; the audit seed does not change them.

Note [Empty rows in the combine]
--------------------------------
A row that attended nothing in a split has LSE -inf there, and one that attended nothing in any
split must come out O = 0, LSE = -inf (FA4's ``flash_fwd_combine.py`` guards ``lse_max == -inf``).
Contiguous dense chunks never make such a row, so each split count also combines the same
partials with rows emptied in every split and in some splits (:func:`_empty_rows`), judged against
the exact combine of those partials.

Note [Combine shapes]
---------------------
FA4's combine kernel tiles the head dim in 64- or 128-column blocks and gives each thread
``max_splits / threads per LSE column`` split slots (``flash_fwd_combine.py``): the forward-fed
shape above (hd 128, 3 and 8 splits) has one head-dim block and one slot per thread, so a fault in
the block offset or in the slots past the first is invisible to it (the fourth red-team round,
``docs/results/redteam4/analysis.md``). :data:`SHAPES` adds synthetic fp32 partials (normal O,
LSE spread over 8 nats, seeded) at head dims 64 (16-row tiles, 20 splits: two slots), 128 (40
splits: two slots), 192 (a half block, predicated; SM90, where attention returns it) and 256 (two
blocks), each with rows empty in
every split, in the first splits and in the *last* splits (a largest valid split below S - 1),
judged against the exact combine of the same partials (``combine_out`` / ``combine_lse``).

Note [The varlen combine]
-------------------------
``flash_attn_combine`` also takes packed partials with ``cu_seqlens`` (a varlen forward's split
outputs), where each sequence's rows start at its own offset. The combine is row by row, so the
same partials packed into sequences of unequal lengths (:func:`varlen_lengths`) must merge to the
exact combine of those rows (:func:`_varlen_rows`); a fault in the sequence offsets moves rows.

Note [Used rows and virtual batches]
------------------------------------
``flash_attn_combine`` takes ``seqused`` (int32, batch: merge only the first ``seqused[b]`` rows of
each sequence; ``seqused`` alone makes the kernel run its varlen scheduler) and
``virtual_batch_idx`` (int32, batch: kernel slot i merges batch ``virtual_batch_idx[i]``; with
``cu_seqlens`` / ``seqused`` the scheduler maps the slot, else the kernel), each its own compile
key (``interface.py`` ``flash_attn_combine`` / ``_flash_attn_fwd_combine``; offsets and lengths
are read with the real batch index, ``seqlen_info.py``). A row no slot or used length reaches is
left unwritten (``out`` is ``torch.empty``), so only the used rows of the mapped batches are
judged, against the exact combine of the same partial rows (:func:`_indexed_rows`), and every
other row of a NaN-filled ``out`` must stay NaN (FA4 writes only those: a merge past a used length
or into a batch no slot maps to shows there): ``seqused`` alone (batched), ``virtual_batch_idx``
alone (batched, every slot on the last batch: the others are never written), and both with
``cu_seqlens`` (the sequences reversed). A fault that reads a sequence's length or offset with the
slot's index instead of the batch's, ignores the mapping, or merges past the used length, moves,
mixes or adds rows.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from fa4verify.audit.registry import CheckContext, CheckResult, check

#: (batch, seqlen_q, nheads, head_dim, seqlen_k), the splits, the input seed (Note [Combine on the GPU])
SHAPE = (2, 256, 4, 128, 2048)
SPLITS = (3, 8)
SEED = 1
#: (head_dim, num_splits) of the synthetic partials (Note [Combine shapes]); (batch, rows, heads)
SHAPES = ((64, 20), (128, 40), (192, 5), (256, 3))
SHAPE_ROWS = (1, 40, 2)


def shapes_for(arch: str) -> tuple[tuple[int, int], ...]:
    """:data:`SHAPES` at the head dims an attention call on ``arch`` returns (SM 10.x: not 192)."""
    from fa4verify.kernels import facts
    return tuple((d, S) for d, S in SHAPES if facts.head_dims_supported(arch, d, d))


def varlen_lengths(total: int) -> tuple[int, ...]:
    """The unequal sequence lengths ``total`` packed query rows are cut into for the varlen
    combine (a fifth, two fifths, one row, the rest; Note [The varlen combine])."""
    a, b = max(1, total // 5), max(1, 2 * total // 5)
    return (a, b, 1, total - a - b - 1) if total > a + b + 1 else (total,)


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def run_combine(kernel: Any, *, dtype: str = "bf16", shape=SHAPE, splits=SPLITS, seed: int = SEED
                ) -> list[dict[str, Any]]:
    """One row per split count: ``{"num_splits", "verdicts": [Verdict, ...]}`` (the partials', the
    combine stage's and the merged output's). ``kernel``: ``forward(q, k, v) -> (out, lse)``
    (FA4's layouts, on its device) and ``combine(out_partial, lse_partial, out_dtype) -> (out, lse)``."""
    import torch
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    from fa4verify.judge import arrays_from, dense_problem, forward_allowances
    from fa4verify.judge.split_combine import judge_split_combine, split_problems
    b, sq, h, d, sk = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, h, d, generator=gen).to(tdt) for n in (sq, sk, sk))
    z = np.zeros
    prob = dense_problem(z((b, sq, h, d)), z((b, sk, h, d)), z((b, sk, h, d)), arch=kernel.arch, dtype=dtype)
    a = arrays_from(_np(q), _np(k), _np(v))
    _, _, _, ofwd = forward_allowances(prob, a)
    from fa4verify import blame
    dev = kernel.device
    rows = []
    for S in splits:
        chunks = split_problems(prob, a, S)
        try:
            parts = [kernel.forward(q.to(dev), k[:, k0:k1].contiguous().to(dev), v[:, k0:k1].contiguous().to(dev))
                     for _, _, (k0, k1) in chunks]
            op = torch.stack([p[0] for p in parts])                      # (S, b, sq, h, d)
            lp = torch.stack([p[1] for p in parts]).transpose(-1, -2)    # (S, b, sq, h), seqlen-contiguous
            out, lse = kernel.combine(op.float(), lp, tdt)
            empty = (_empty_rows(kernel, op, lp, tdt, dtype) + _varlen_rows(kernel, op, lp, tdt, dtype)
                     + _indexed_rows(kernel, op, lp, tdt, dtype))
        except Exception as e:  # noqa: BLE001 - Note [Blame]: FA4's exception is FA4's failure
            if blame.origin(e) != blame.FA4:
                raise                                                    # fa4verify's own: an error
            rows.append({"num_splits": S, "verdicts": [], "raised": blame.describe(e)[:300]})
            continue
        j = judge_split_combine(prob, a, S, [_np(p[0]) for p in parts], [_np(p[1]) for p in parts],
                                _np(out), None if lse is None else np.transpose(_np(lse), (0, 2, 1)),
                                full_oracle=ofwd)
        rows.append({"num_splits": S, "verdicts": [*j.partial_out, *j.partial_lse, j.stage, j.stage_lse, j.out,
                                                   j.lse, *empty],
                     "config": getattr(kernel, "last_config", None)})
    return rows


def shape_rows(kernel: Any, *, dtype: str = "bf16", shapes=None, seed: int = SEED) -> list[dict[str, Any]]:
    """Note [Combine shapes]: one row per (head dim, splits) of synthetic partials (default
    :func:`shapes_for` the kernel's arch), judged against the exact combine of the same partials."""
    shapes = shapes_for(kernel.arch) if shapes is None else shapes
    import dataclasses

    import torch

    from fa4verify import blame
    from fa4verify.judge.split_combine import judge_combine_stage
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    b, sq, h = SHAPE_ROWS
    rows = []
    for d, S in shapes:
        gen = torch.Generator().manual_seed(seed * 1000 + d + S)
        op = torch.randn(S, b, sq, h, d, generator=gen)
        lp = (torch.randn(S, b, h, sq, generator=gen) * 8.0).transpose(-1, -2)   # (S, b, sq, h), seqlen-contiguous
        lp[:, :, 0::7] = float("-inf")                 # empty in every split
        lp[: S // 2, :, 3::7] = float("-inf")          # empty in the first splits
        lp[S // 3:, :, 5::7] = float("-inf")           # empty in the last splits: largest valid split < S - 1
        op = torch.where(torch.isneginf(lp)[..., None], torch.zeros((), dtype=op.dtype), op)
        label = f"{S} (hd {d}, synthetic)"
        try:
            out, lse = kernel.combine(op.to(kernel.device), lp.to(kernel.device), tdt)
        except Exception as e:  # noqa: BLE001 - Note [Blame]: FA4's exception is FA4's failure
            if blame.origin(e) != blame.FA4:
                raise
            rows.append({"num_splits": label, "verdicts": [], "raised": blame.describe(e)[:300]})
            continue
        vo, vl = judge_combine_stage(_np(op), _np(lp), _np(out), None if lse is None else _np(lse), dtype=dtype,
                                     arch=kernel.arch)
        rows.append({"num_splits": label, "verdicts": [dataclasses.replace(vo, name=f"combine_out (hd {d})"),
                                                       dataclasses.replace(vl, name=f"combine_lse (hd {d})")],
                     "config": getattr(kernel, "last_config", None)})
    return rows


def _empty_rows(kernel: Any, op, lp, out_dtype, dtype: str) -> list:
    """Note [Empty rows in the combine]: the same partials with query rows that attended nothing
    in every split (every 5th row: LSE -inf, O 0 in all S partials, as a causal or windowed split
    leaves them; FA4 must return O = 0, LSE = -inf, not NaN) and rows empty in the first
    ``S // 2 + 1`` splits only (the 3rd of every 5), judged against the exact combine of the
    same partials (``combine_out`` / ``combine_lse``). The merge against the full problem does
    not apply to these rows."""
    import dataclasses

    from fa4verify.judge.split_combine import judge_combine_stage
    op2, lp2 = op.clone(), lp.clone()
    lp2[:, :, 0::5] = float("-inf")
    op2[:, :, 0::5] = 0
    some = lp.shape[0] // 2 + 1
    lp2[:some, :, 2::5] = float("-inf")
    op2[:some, :, 2::5] = 0
    out, lse = kernel.combine(op2.float(), lp2, out_dtype)
    vo, vl = judge_combine_stage(_np(op2), _np(lp2), _np(out), None if lse is None else _np(lse), dtype=dtype,
                                 arch=kernel.arch)
    return [dataclasses.replace(vo, name="combine_out (empty rows)"),
            dataclasses.replace(vl, name="combine_lse (empty rows)")]


def _packed(op, lp, lens):
    """The batched partials (S, b, sq, h, d) / (S, b, sq, h) packed as sequences of ``lens`` rows:
    (S, total, h, d), (S, total, h) total-contiguous, and ``cu_seqlens``."""
    import torch
    S, b, sq, h, d = op.shape
    total = b * sq
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    opv = op.float().reshape(S, total, h, d)
    lpv = lp.permute(0, 3, 1, 2).reshape(S, h, total).transpose(-1, -2)   # (S, total, h), total-contiguous
    return opv, lpv, cu


def _varlen_rows(kernel: Any, op, lp, out_dtype, dtype: str) -> list:
    """Note [The varlen combine]: the partials packed as sequences of :func:`varlen_lengths` rows
    (``cu_seqlens``), merged by the kernel's varlen combine and judged against the exact combine of
    the packed rows; none for a kernel without one."""
    import dataclasses

    from fa4verify.judge.split_combine import judge_combine_stage
    if not hasattr(kernel, "combine_indexed"):
        return []
    lens = varlen_lengths(op.shape[1] * op.shape[2])
    opv, lpv, cu = _packed(op, lp, lens)
    out, lse = kernel.combine_indexed(opv, lpv, out_dtype, cu_seqlens=cu)
    vo, vl = judge_combine_stage(_np(opv)[:, None], _np(lpv)[:, None], _np(out)[None],
                                 None if lse is None else _np(lse)[None], dtype=dtype, arch=kernel.arch)
    return [dataclasses.replace(vo, name=f"combine_out (varlen {'/'.join(map(str, lens))})"),
            dataclasses.replace(vl, name=f"combine_lse (varlen {'/'.join(map(str, lens))})")]


def used_rows(lens: Sequence[int], used: Optional[Sequence[int]], vbi: Optional[Sequence[int]],
              offsets: Optional[Sequence[int]] = None) -> list[tuple[int, int]]:
    """Note [Used rows and virtual batches]: the (batch, row) pairs a combine with these arguments
    must write: each batch some slot maps to (every batch without ``vbi``), its first ``used[b]``
    rows (all ``lens[b]`` without ``used``); with ``offsets`` (``cu_seqlens[:-1]``) the row is the
    packed index ``offsets[b] + m`` (batch 0)."""
    batches = sorted(set(vbi)) if vbi is not None else range(len(lens))
    out = []
    for r in batches:
        n = used[r] if used is not None else lens[r]
        out += [(0, offsets[r] + m) if offsets is not None else (r, m) for m in range(n)]
    return out


def _indexed_rows(kernel: Any, op, lp, out_dtype, dtype: str) -> list:
    """Note [Used rows and virtual batches]: the partials merged with ``seqused``, with
    ``virtual_batch_idx`` and with both on packed sequences, each judged on the rows the call must
    write; none for a kernel without the indexed combine, and a named skip row for a release whose
    combine lacks one of the keywords."""
    import dataclasses

    import torch

    from fa4verify.judge.split_combine import judge_combine_stage
    from fa4verify.kernels.facts import combine_takes
    if not hasattr(kernel, "combine_indexed"):
        return []
    S, b, sq, h, d = op.shape
    used = [max(1, (sq * (i + 1)) // (b + 2)) for i in range(b)]          # each below its length, distinct
    vbi = [b - 1] * b                      # every slot on the last batch: the others stay unwritten
    lens = varlen_lengths(b * sq)
    plens = list(lens)
    pused = [max(1, n - 1 - i) for i, n in enumerate(plens)]
    pvbi = list(range(len(plens)))[::-1]
    opv, lpv, cu = _packed(op, lp, lens)
    i32 = dict(dtype=torch.int32)
    cases = [("seqused", op.float(), lp, {"seqused": torch.tensor(used, **i32)}, [sq] * b, used, None, None),
             ("virtual_batch_idx", op.float(), lp, {"virtual_batch_idx": torch.tensor(vbi, **i32)}, [sq] * b, None,
              vbi, None),
             ("cu_seqlens+seqused+virtual_batch_idx", opv, lpv,
              {"cu_seqlens": cu, "seqused": torch.tensor(pused, **i32), "virtual_batch_idx": torch.tensor(pvbi, **i32)},
              plens, pused, pvbi, cu[:-1].tolist())]
    out_rows = []
    for label, o_in, l_in, kw, ls, us, vb, offs in cases:
        if not all(combine_takes(k) for k in kw):
            continue          # an older release: its combine has no such keyword (reported by the check)
        shape = o_in.shape[1:]                         # (b, sq, h, d) batched, (total, h, d) packed
        out, lse = kernel.combine_indexed(o_in, l_in, out_dtype, out=torch.full(shape, float("nan"), dtype=out_dtype,
                                                                                device=o_in.device), **kw)
        rows = used_rows(ls, us, vb, offs)
        bi = torch.tensor([r for r, _ in rows])
        mi = torch.tensor([m for _, m in rows])
        o3 = out.cpu() if offs is None else out.cpu()[None]
        written = ~torch.isnan(o3).all(-1).all(-1)     # (b, rows) or (1, total): rows FA4 wrote
        want = torch.zeros_like(written)
        want[bi, mi] = True
        stray = written & ~want
        if offs is not None:                 # packed: (S, total, h[, d]) -> one batch
            o_in, l_in, out = o_in[:, None], l_in[:, None], out[None]
            lse = None if lse is None else lse[None]
        sel_o = o_in.cpu()[:, bi, mi][:, None]                               # (S, 1, rows, h, d)
        sel_l = l_in.cpu()[:, bi, mi][:, None]
        got_o = out.cpu()[bi, mi][None]
        got_l = None if lse is None else lse.cpu()[bi, mi][None]
        vo, vl = judge_combine_stage(_np(sel_o), _np(sel_l), _np(got_o), None if got_l is None else _np(got_l),
                                     dtype=dtype, arch=kernel.arch)
        out_rows += [dataclasses.replace(vo, name=f"combine_out ({label})"),
                     dataclasses.replace(vl, name=f"combine_lse ({label})")]
        if stray.any():         # rows FA4 must leave alone were written
            n = int(stray.sum())
            out_rows.append(dataclasses.replace(
                vo, name=f"combine_out ({label}, rows outside the used ones)", status="fail", tightness=float("inf"),
                reason=f"{n} row(s) no used length or mapped batch reaches were written, first "
                       f"{tuple(int(x) for x in stray.nonzero()[0])}"))
    return out_rows


class _Fa4:
    """FA4 through the adapter, on the GPU."""
    device = "cuda"

    def __init__(self, arch: str):
        from fa4verify.kernels import adapter
        self.ad, self.arch = adapter, arch

    def forward(self, q, k, v):
        r = self.ad.forward(q, k, v, return_lse=True)
        return r.out, r.lse

    def combine(self, op, lp, out_dtype):
        out, lse, self.last_config = self.ad.combine(op, lp, out_dtype=out_dtype)
        return out, lse

    def combine_indexed(self, op, lp, out_dtype, out=None, **index):
        """The combine with ``cu_seqlens`` / ``seqused`` / ``virtual_batch_idx`` (int32 tensors) into
        ``out`` (a caller's buffer, or FA4's own)."""
        out, lse, _ = self.ad.combine(op, lp, out_dtype=out_dtype, out=out,
                                      **{k: v.to(op.device) for k, v in index.items()})
        return out, lse


def result(rows: list[dict[str, Any]], where: str) -> CheckResult:
    """The check's verdict: the worst of every row's verdicts (one judge)."""
    from fa4verify.judge import worst_status
    verdicts = [vd for r in rows for vd in r["verdicts"]]
    raised = [f"{r['num_splits']} splits: {r['raised']}" for r in rows if r.get("raised")]
    status = "fail" if raised else worst_status([vd.status for vd in verdicts])
    tight = max((vd.tightness for vd in verdicts if vd.n_compared), default=0.0)
    table = {"columns": ["splits", "quantity", "verdict", "tightness", "reason"],
             "rows": [[r["num_splits"], vd.name, vd.status, round(vd.tightness, 4), vd.reason]
                      for r in rows for vd in r["verdicts"]]}
    bad = raised + [f"{r['num_splits']} splits: {vd.name} {vd.status}" + (f" ({vd.reason})" if vd.reason else "")
                    for r in rows for vd in r["verdicts"] if vd.status != "pass"]
    b, sq, h, d, sk = SHAPE
    shape = f"{b} x {sq} x {h} x {d}, seqlen_k {sk}"
    fed = [str(r["num_splits"]) for r in rows if isinstance(r["num_splits"], int)]
    synth = [str(r["num_splits"]).replace(" (", " splits at ").replace(", synthetic)", "")
             for r in rows if not isinstance(r["num_splits"], int)]
    summary = ("; ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "") if bad else
               f"{shape}, {', '.join(fed)} splits: per-chunk forwards, the combine stage and the merged output "
               f"within budget" + (f"; synthetic partials ({', '.join(synth)}) within the combine stage's"
                                   if synth else "") + f" (tightness {tight:.3g})")
    return CheckResult(status=status, where=where, summary=summary, tightness=tight,
                       metrics={"max_tightness": tight, "verdicts": len(verdicts)},
                       details={"table": table, "combine_configs": [r.get("config") for r in rows]})


def _combine_compiles(ctx: CheckContext) -> list:
    """Note [Fake device audit]: the check's forwards on its key chunks and its combines."""
    from fa4verify.compile.production import CompileCall
    from fa4verify.kernels.facts import combine_takes
    from fa4verify.problem import AttentionProblem
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the combine is judged for bf16 / fp16 outputs, not {ctx.dtype}")
    b, sq, h, d, sk = SHAPE
    sizes = sorted({-(-sk // S) for S in SPLITS} | {sk // S for S in SPLITS})
    def problem(n):
        return AttentionProblem(arch=ctx.require_gpu().arch, dtype=ctx.dtype, batch=b, seqlen_q=sq, seqlen_k=n,
                                nheads=h, nheads_kv=h, head_dim=d, head_dim_v=d)
    lens = varlen_lengths(b * sq)
    varlen = AttentionProblem(arch=ctx.require_gpu().arch, dtype=ctx.dtype, batch=len(lens), seqlen_q=max(lens),
                              seqlen_k=max(lens), seqlens_q=lens, seqlens_k=lens, nheads=h, nheads_kv=h, head_dim=d,
                              head_dim_v=d)
    def shaped(hd):
        return AttentionProblem(arch=ctx.require_gpu().arch, dtype=ctx.dtype, batch=SHAPE_ROWS[0],
                                seqlen_q=SHAPE_ROWS[1], seqlen_k=SHAPE_ROWS[1], nheads=SHAPE_ROWS[2],
                                nheads_kv=SHAPE_ROWS[2], head_dim=hd, head_dim_v=hd)
    return ([CompileCall("forward", problem(n), purpose="a key chunk's partial O and LSE") for n in sizes]
            + [CompileCall("combine", problem(sk), splits=S, purpose="the merge of the partials") for S in SPLITS]
            + [CompileCall("combine", varlen, splits=S, purpose="the varlen merge (cu_seqlens)") for S in SPLITS]
            + [CompileCall("combine", p, splits=S, index=ix, purpose="used rows / virtual batches "
                           "(Note [Used rows and virtual batches])")
               for p, ix in ((problem(sk), ("seqused",)), (problem(sk), ("virtual_batch_idx",)),
                             (varlen, ("seqused", "virtual_batch_idx")))
               if all(combine_takes(k) for k in ix) for S in SPLITS]
            + [CompileCall("combine", shaped(hd), splits=S, purpose="synthetic partials (Note [Combine shapes])")
               for hd, S in shapes_for(ctx.require_gpu().arch)])


@check("production.combine", title="FA4's flash_attn_combine merges split partials within budget (live)",
       needs={"cuda", "fa4"}, profiles={"default", "full", "exhaustive"}, cost=15, compiles=_combine_compiles)
def production_combine(ctx: CheckContext) -> CheckResult:
    """Per-chunk FA4 forwards merged by FA4's ``flash_attn_combine``, judged against the chunks'
    oracles, the exact combine of the same partials and the full problem's oracle (Note [Combine
    on the GPU]). Inputs fixed (seed 1); S = 3 and 8; and synthetic partials at the head dims and
    split counts of Note [Combine shapes]."""
    gpu = ctx.require_gpu()
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the combine is judged for bf16 / fp16 outputs, not {ctx.dtype}")
    kernel = _Fa4(gpu.arch)
    r = result(run_combine(kernel, dtype=ctx.dtype) + shape_rows(kernel, dtype=ctx.dtype), ctx.where_measured())
    from fa4verify.kernels.facts import combine_takes
    lacks = [k for k in ("seqused", "virtual_batch_idx") if not combine_takes(k)]
    if lacks:            # Note [Used rows and virtual batches]: not judged where the release has none
        r.summary += f"; this FA4 release's flash_attn_combine takes no {' / '.join(lacks)} (not judged)"
    return r
