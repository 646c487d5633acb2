#!/usr/bin/env bash
# Issue 16 items 3, 4, 7 on the H200 (scripts/gpu_features.py): paged KV (permutation bitwise +
# within budget), per-chunk forwards + flash_attn_combine vs full forward and oracle, and the
# SM90 block-sparse backward prediction at hd 200/208/232/240 (controls hd 128, 256), and the
# backward with seqused_k (causal and not) within the composed budget.
#   bash scripts/gpu/features.sh            all four sections   (~5-7 min on the H200 with cold FA4 compiles, estimate)
#   bash scripts/gpu/features.sh paged      one section: paged | combine | sparse_fwd | sparse | seqused_bwd
#   bash scripts/gpu/features.sh seqused_bwd   (~30-60 s on the H200: two FA4 fwd+bwd compiles, estimate)
#   SPARSE_HDS=128,208,224 bash scripts/gpu/features.sh sparse   lean sparse study (~1.5 min)
# Writes $OUT/features_<section>.json and .log; prints one summary line per section.
# FEATURES_DEVICE=cpu runs the CPU stand-in (tests only; not evidence).
set -u
sections="${1:-paged combine sparse_fwd sparse seqused_bwd}"
: "${OUT:?set OUT to the output folder}"
rc=0
for s in $sections; do
  case "$s" in
    paged)   lim=150 ;;
    combine) lim=150 ;;
    sparse_fwd) lim=120 ;;
    sparse)  lim=420 ;;
    seqused_bwd) lim=120 ;;
    *) echo "usage: $0 [paged|combine|sparse_fwd|sparse|seqused_bwd]" >&2; exit 2 ;;
  esac
  extra=()
  [ "$s" = sparse ] && [ -n "${SPARSE_HDS:-}" ] && extra=(--head-dims "$SPARSE_HDS")
  # combine: synchronous launches, so the log names the call that faults (session 4: an
  # illegal memory access whose call was not identified)
  blocking=0; [ "$s" = combine ] && blocking=1
  CUDA_LAUNCH_BLOCKING=$blocking timeout "$lim" python3 scripts/gpu_features.py --section "$s" --json "$OUT/features_$s.json" \
    --device "${FEATURES_DEVICE:-cuda}" \
    ${extra[@]+"${extra[@]}"} > "$OUT/features_$s.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=$r
  tail -n 1 "$OUT/features_$s.log"
  [ $r -eq 124 ] && echo "[$s] TIMED OUT after ${lim}s (partial log in features_$s.log)"
done
exit $rc
