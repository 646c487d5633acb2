"""Compile-only (sm_90a, this CPU) of the smallest reaching call of each fault, on the clean FA4 and
on the fault's patched copy ($TMPDIR/redteam11/<id>, from edits.py): the fault must trace and build where it
changes something. Usage: python compile_check.py <mutant id|clean> <case name>..."""
import json, os, sys, time
os.environ.setdefault("FA4VERIFY_FAKE_DEVICE", "h200")
mid = sys.argv[1]
if mid != "clean":
    os.environ["PYTHONPATH"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "redteam11", mid) + os.pathsep + os.environ.get("PYTHONPATH", "")
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.problem.calls import CallForm
from fa4verify.compile.production import CompileCase, run_cases

def P(**kw):
    base = dict(arch="sm90", dtype="bf16", batch=1, seqlen_q=128, seqlen_k=128, nheads=2, nheads_kv=2,
                head_dim=128, head_dim_v=128, values=ValueSpec("normal", 0))
    base.update(kw)
    return AttentionProblem(**base)

CASES = {
    # paged cp.async (page 16 at tile_n 128), 2 sequences of 64 keys
    "paged16": ("forward", P(batch=2, seqlen_q=1, seqlen_k=64, seqlens_q=(1, 1), seqlens_k=(64, 64), causal=True,
                             call=CallForm(seqused_k=True, kv_capacity=64, page_size=16, page_seed=3, q_batched=True))),
    # cp.async PackGQA (7 query heads per KV head at tile_m 128), hd 128, hdv 72
    "pack7_hdv72": ("forward", P(nheads=7, nheads_kv=1, head_dim=128, head_dim_v=72, seqlen_q=40, seqlen_k=64)),
    # MHA backward at hd 128 / hdv 72 (the preprocess's hdv padding)
    "bwd_hdv72": ("backward", P(head_dim=128, head_dim_v=72, seqlen_q=100, seqlen_k=100)),
    "bwd_hdv72_causal": ("backward", P(head_dim=128, head_dim_v=72, seqlen_q=100, seqlen_k=100, causal=True)),
    "bwd_96_72": ("backward", P(head_dim=96, head_dim_v=72, seqlen_q=100, seqlen_k=100)),
    "bwd_192_136": ("backward", P(head_dim=192, head_dim_v=136, seqlen_q=100, seqlen_k=100)),
    "bwd_64_40": ("backward", P(head_dim=64, head_dim_v=40, seqlen_q=100, seqlen_k=100)),
    # deterministic varlen causal backward (spt: the varlen LPT order)
    "varlen_det_causal": ("backward", P(batch=2, seqlen_q=16, seqlen_k=400, seqlens_q=(16, 16), seqlens_k=(400, 300),
                                         causal=True)),
}
names = sys.argv[2:] or list(CASES)
cases = []
for n in names:
    op, p = CASES[n]
    cases.append(CompileCase(op, deterministic=True, problem_json=p.to_json()))
t0 = time.time()
r = run_cases("sm_90a", cases, timeout=1800)
for n, c in zip(names, r["results"]):
    print(mid, n, "ok" if c.get("ok") else "FAILED", {k: v for k, v in c.items() if k in ("error", "refused", "seconds", "configs")})
print("wall", round(time.time() - t0, 1))
