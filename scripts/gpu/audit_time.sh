#!/usr/bin/env bash
# GPU audit wall time per check, before/after the worker pool (benchmarks/gpu_audit_time.py).
#   bash scripts/gpu/audit_time.sh quick     quick profile: before, cold, warm   (~3 min on the H200)
#   bash scripts/gpu/audit_time.sh default   default profile: cold, warm + the session-3 recording
set -u
prof="${1:-default}"
case "$prof" in
  quick)   modes="before,cold,warm" ;;
  default) modes="cold,warm" ;;
  *) echo "usage: $0 quick|default" >&2; exit 2 ;;
esac
rec=docs/results/h200_session3/audit_h200_default.json
extra=()
[ "$prof" = default ] && extra=(--recorded "$rec")
timeout 590 python3 benchmarks/gpu_audit_time.py --profile "$prof" --modes "$modes" \
  --out "$OUT/audit_time_$prof" "${extra[@]}" 2>&1 | tee "$OUT/audit_time_$prof.txt"
