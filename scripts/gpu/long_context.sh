#!/usr/bin/env bash
# Long-context audit on the lent H200 (issue #17 items 3 and 5). Run from the repo root:
#   bash scripts/gpu/long_context.sh
# 1. benchmarks/gpu_long_context.py at seqlen 32768 then 131072 (1 x 8 x hd128, causal, bf16,
#    FA4 fwd+bwd, streamed fp64 oracle, every row judged): time per phase and tightness.
# 2. a one-worker sharding smoke run: pytest --fa4verify=long -n 1 (xdist worker gw0 pinned to
#    GPU 0 by fa4verify.sharding), the production.long_context check at seqlen 32768 only.
# Expected wall time: ~15 s FA4 compile (cached after) + ~10 s (32k) + ~60 s (128k) + ~40 s smoke;
# hard cap 270 s. Outputs in $OUT: long_context.json/.log, smoke.log, smoke_junit.xml.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
timeout 60 python3 benchmarks/gpu_long_context.py --seqlens 32768 --json "$OUT/long_context_32k.json" \
  > "$OUT/long_context_32k.log" 2>&1
echo "32k rc=$? wall=$(( $(date +%s) - t0 ))s"; cat "$OUT/long_context_32k.log" | tail -12
t1=$(date +%s)
timeout 150 python3 benchmarks/gpu_long_context.py --seqlens 131072 --json "$OUT/long_context_128k.json" \
  > "$OUT/long_context_128k.log" 2>&1
echo "128k rc=$? wall=$(( $(date +%s) - t1 ))s"; cat "$OUT/long_context_128k.log" | tail -12
t2=$(date +%s)
FA4VERIFY_LONG_SEQLENS=32768 timeout 60 python3 -m pytest -q -p no:cacheprovider -n 1 --fa4verify=long --fa4-only \
  --fa4-device cuda -k long_context --junitxml "$OUT/smoke_junit.xml" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$? wall=$(( $(date +%s) - t2 ))s"; tail -5 "$OUT/smoke.log"
echo "total wall=$(( $(date +%s) - t0 ))s"
