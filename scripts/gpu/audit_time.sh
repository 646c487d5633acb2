#!/usr/bin/env bash
# GPU audit wall time per check, cold and warm (benchmarks/gpu_audit_time.py).
#   bash scripts/gpu/audit_time.sh default  cold, warm; the last recorded cold/warm runs as the
#                                           'before' columns (~1.5 min on the H200)
#   bash scripts/gpu/audit_time.sh quick    cold, warm (~1.5 min on the H200)
#   bash scripts/gpu/audit_time.sh all      default then quick (~4.5 min)
# Run from the repo root; writes $OUT/audit_time_<profile>/ (JSON reports, logs, the table as
# .txt and .json) and $OUT/audit_time_<profile>.txt (stdout); prints the table.
set -u
OUT="${OUT:-out}"
mkdir -p "$OUT"
base=docs/results/h200/audit_time
one() {
  local prof="$1" modes rec=() lim
  case "$prof" in
    default) modes="cold,warm"; lim=330
             rec=(--recorded "last-cold=$base/audit_default_cold.json"
                  --recorded "last-warm=$base/audit_default_warm.json") ;;
    quick)   modes="cold,warm"; lim=270
             rec=(--recorded "last-cold=$base/audit_quick_cold.json") ;;
  esac
  modes="${AUDIT_MODES:-$modes}"     # e.g. AUDIT_MODES=cold,warm for a lean run
  echo "== audit time, profile $prof (modes $modes) =="
  timeout "$lim" python3 benchmarks/gpu_audit_time.py --profile "$prof" --modes "$modes" \
    --timeout 200 --out "$OUT/audit_time_$prof" "${rec[@]}" 2>&1 | tee "$OUT/audit_time_$prof.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "audit_time $prof: exit $rc (124 = the step's time limit)"
}
case "${1:-default}" in
  default|quick) one "$1" ;;
  all) one default; one quick ;;
  *) echo "usage: $0 default|quick|all" >&2; exit 2 ;;
esac
