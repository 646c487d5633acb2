"""The float64 model of FA4's varlen block-sparse stride finding (``sm90_varlen_sparse_kv_stride``
in fa4verify/fuzz/known_issues.py) against what the H200 returned.

FA4's SM90 forward reads Q block ``m`` of sequence ``b`` from ``cu_block_idx_offsets[b] + m *
ceil(seqlen_k_b / 128)`` (its ``SeqlenInfoQK`` is built with the default tile_n 128) while the
lists are laid out with the kernel's own tile_n (96 at head dim 192). The model replays that read:
``full_block_cnt[m]`` entries from the wrong offset, padding entries (block 0) included, each
listed block's keys entering the softmax once per listing (FA4 iterates the list). For every
failing variant of a triage JSON (``scripts/gpu_triage_case.py --json``) it prints, at the worst
elements the run recorded, the kernel's value, the right value (the float64 oracle of the problem)
and the model's. CPU only; the arrays are the problem's own (deterministic in its fields).

    python scripts/varlen_sparse_stride_model.py docs/results/h200/triage_5c59db7/triage.json
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np

WORST = re.compile(r"\((\d+), (\d+), (\d+)\): got (\S+), oracle (\S+),")


def attend(problem, arrays, stride_tile=None):
    """O (packed, float64) of ``problem`` with FA4's list read at ``stride_tile`` (None: right)."""
    from fa4verify.fuzz.known_issues import _token_bounds
    from fa4verify.kernels.adapter import _block_lists
    call = problem.call
    bq, bk = call.block_size
    q, k, v = (np.asarray(arrays[n], np.float64) for n in "qkv")
    sink = np.asarray(arrays["learnable_sink"], np.float64) if problem.sink else None
    flat, counts, start = [], [], [0]
    for i, (_q0, lq, _k0, lk) in enumerate(_token_bounds(problem)):
        m = call.block_mask(lq, lk, seq=i)
        c, idx = _block_lists(m)
        counts.append(c)
        flat.extend(idx.reshape(-1).tolist())
        start.append(start[-1] + m.size)
    flat = np.asarray(flat)
    out = np.zeros((q.shape[0], problem.nheads, problem.head_dim_v))
    g = problem.nheads // problem.nheads_kv
    for i, (q0, lq, k0, lk) in enumerate(_token_bounds(problem)):
        stride = -(-lk // (stride_tile or bk))
        weight = np.zeros((lq, lk))
        for mb in range(len(counts[i])):
            off = start[i] + mb * stride
            for kb in flat[off:off + counts[i][mb]]:
                weight[mb * bq:(mb + 1) * bq, kb * bk:(kb + 1) * bk] += 1
        for h in range(problem.nheads):
            x = q[q0:q0 + lq, h] @ k[k0:k0 + lk, h // g].T * problem.scale
            y = problem.softcap * np.tanh(x / problem.softcap) if problem.softcap else x
            y = np.where(weight > 0, y, -np.inf)
            mx = y.max(axis=1, initial=-np.inf)
            if sink is not None:
                mx = np.maximum(mx, sink[h])
            mx = np.where(np.isfinite(mx), mx, 0.0)
            e = weight * np.exp(y - mx[:, None])
            s = e.sum(axis=1) + (np.exp(sink[h] - mx) if sink is not None else 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[q0:q0 + lq, h] = np.where(s[:, None] > 0, e / np.where(s > 0, s, 1.0)[:, None], 0.0) \
                    @ v[k0:k0 + lk, h // g]
    return out


def main(path: str) -> int:
    from fa4verify.fuzz.known_issues import SEQLEN_INFO_TILE_N, varlen_sparse_misread_tokens
    from fa4verify.problem import AttentionProblem
    d = json.loads(open(path).read())
    print(f"# {d['where']}; model: KV-block list stride ceil(seqlen_k / {SEQLEN_INFO_TILE_N})")
    print(f"{'variant':30s} {'element':16s} {'kernel':>13s} {'right':>13s} {'model':>13s}  rows the finding names")
    for r in d["variants"]:
        if r["outcome"] != "FAIL" or "problem" not in r:
            continue
        p = AttentionProblem.from_json(json.dumps(r["problem"]))
        if p.call is None or p.call.block_size is None or not p.varlen:
            continue
        a = p.materialize()
        right, model = attend(p, a), attend(p, a, SEQLEN_INFO_TILE_N)
        named = varlen_sparse_misread_tokens(p)
        for t, h, e, got, _oracle in WORST.findall(r["detail"]):
            t, h, e = int(t), int(h), int(e)
            print(f"{r['variant']:30s} {str((t, h, e)):16s} {float(got):13.6g} {right[t, h, e]:13.6g} "
                  f"{model[t, h, e]:13.6g}  {bool(named[t])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/h200/triage_5c59db7/triage.json"))
