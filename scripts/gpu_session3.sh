#!/usr/bin/env bash
# Session 3 (2026-12-01) on the lent H200, after the split-bundle recipe (../shared/device/README.md):
#   bash scripts/gpu_session3.sh audit   the default GPU audit from the single judge core, new labels
#   bash scripts/gpu_session3.sh more    deployment audits, the issue-16 predictions, GPU tests
# Outputs land in $OUT (JSON/JUnit/HTML reports, logs).
set -u
test -f /root/site/env.sh || { echo COLD; exit 3; }
. /root/site/env.sh
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 4; }
# the device's copy carries stale git metadata: name the commit that runs (written here by the caller)
test -f .fa4verify-commit && export FA4VERIFY_GIT_COMMIT="$(cat .fa4verify-commit)"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/root/fa4cache
mkdir -p /root/fa4cache
case "${1:-audit}" in
  audit)
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
    t0=$(date +%s)
    timeout 560 fa4verify audit --dtype bf16 --device cuda --seed 0 --json "$OUT/audit_h200_default.json" \
      --junit "$OUT/audit_h200_default.xml" --html "$OUT/audit_h200_default.html" > "$OUT/audit_h200_default.log" 2>&1
    rc=$?
    echo "audit rc=$rc wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/audit_h200_default.log"
    tail -25 "$OUT/audit_h200_default.log"
    ;;
  more)
    t0=$(date +%s)
    timeout 200 fa4verify audit --dtype bf16 --device cuda --seed 0 --deployment llama3-8b \
      -k "production or budgets.production or head_dims" --json "$OUT/audit_h200_llama3.json" \
      > "$OUT/audit_h200_llama3.log" 2>&1
    echo "llama3 rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/audit_h200_llama3.log"
    t0=$(date +%s)
    timeout 150 fa4verify audit --dtype bf16 --device cuda --seed 0 --deployment small-hd \
      -k "budgets.production or head_dims" --json "$OUT/audit_h200_smallhd.json" > "$OUT/audit_h200_smallhd.log" 2>&1
    echo "small-hd rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/audit_h200_smallhd.log"
    timeout 150 python3 scripts/gpu_predictions.py --json "$OUT/predictions_h200.json" > "$OUT/predictions_h200.log" 2>&1
    echo "predictions rc=$?" | tee -a "$OUT/predictions_h200.log"
    timeout 120 python3 -m pytest -q -m gpu tests/test_fuzz_production.py tests/test_gpu_production.py \
      > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc=$?" | tee -a "$OUT/gpu_tests.log"
    tail -4 "$OUT/audit_h200_llama3.log" "$OUT/audit_h200_smallhd.log" "$OUT/gpu_tests.log"
    grep -c '"wrong"' "$OUT/predictions_h200.json" 2>/dev/null
    ;;
  more2)
    t0=$(date +%s)
    timeout 330 fa4verify audit --dtype bf16 --device cuda --seed 0 --deployment llama3-8b \
      --json "$OUT/audit_h200_llama3_full.json" > "$OUT/audit_h200_llama3_full.log" 2>&1
    echo "llama3 full rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/audit_h200_llama3_full.log"
    tail -12 "$OUT/audit_h200_llama3_full.log"
    timeout 200 python3 -m pytest -q -m gpu -x --tb=short tests/test_fuzz_production.py > "$OUT/gpu_fuzz_test.log" 2>&1
    echo "gpu fuzz test rc=$?" | tee -a "$OUT/gpu_fuzz_test.log"
    tail -30 "$OUT/gpu_fuzz_test.log"
    ;;
esac
