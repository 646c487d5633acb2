#!/usr/bin/env bash
# Session 7 (2026-12-01) on the lent H200, after the split-bundle recipe (../shared/device/README.md).
#   bash scripts/gpu_session7.sh STEP [STEP ...]
# Steps (each writes under $OUT/<step>/, guarded by its own timeout and by a call deadline):
#   tquick     quick audit, cold then warm, with the timeline (benchmarks/gpu_audit_time.py)
#   tdefault   default audit, cold then warm, with the timeline
#   tdefault@N, tquick@N   the same with --workers N (its own empty kernel cache)
#   tquick:spawn, tdefault:fork ...  the same with FA4VERIFY_WORKER_START=spawn|fork
#   profile    the default audit once more on tdefault's (warm) kernel cache, each worker request
#              under cProfile (FA4VERIFY_WORKER_PROFILE): where the warm seconds go
#   gputests   pytest -m gpu (-n GPU_TEST_WORKERS, default 6, when pytest-xdist is there)
#   imports    python -X importtime of what the zygote imports (torch, FA4's interface, the judge),
#              alone and with a parent importing torch beside it: where a worker's start-up goes
# Env: CALL_BUDGET_S (575), AUDIT_MODES (cold,warm), WORKERS (auto), EXTRA (extra audit args).
set -u
T0=$(date +%s)
DEADLINE=$((T0 + ${CALL_BUDGET_S:-575}))
test -f /root/site/env.sh || { echo COLD; exit 3; }
. /root/site/env.sh
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 4; }
test -f .fa4verify-commit && export FA4VERIFY_GIT_COMMIT="$(cat .fa4verify-commit)"
unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
nproc >> "$OUT/gpu.txt"
ROOT_OUT="$OUT"
CR=/root/kcache7
W=()
[ -n "${WORKERS:-}" ] && W=(-- --workers "$WORKERS")
for step in "$@"; do
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 30 ]; then echo "== $step: skipped, ${left}s left in this call"; continue; fi
  export OUT="$ROOT_OUT/$step"; mkdir -p "$OUT"
  t=$(date +%s)
  echo "== $step (limit ${left}s)"
  case "$step" in
    tquick|tdefault|tquick[@:]*|tdefault[@:]*)
      prof=${step#t}; prof=${prof%%[@:]*}; WW=("${W[@]}")
      case "$step" in *@*) WW=(-- --workers "${step#*@}") ;; esac
      case "$step" in *:spawn) export FA4VERIFY_WORKER_START=spawn ;; *:fork) export FA4VERIFY_WORKER_START=fork ;;
                      *) unset FA4VERIFY_WORKER_START ;; esac
      rm -rf "$CR/$step"; mkdir -p "$CR/$step"
      s6=docs/results/h200_session6/6_final/t$prof
      REC=(--recorded "s6-cold=$s6/audit_${prof}_cold.json" --recorded "s6-warm=$s6/audit_${prof}_warm.json")
      [ -f "$s6/audit_${prof}_cold.json" ] || REC=()
      timeout "$left" python3 benchmarks/gpu_audit_time.py --profile "$prof" --modes "${AUDIT_MODES:-cold,warm}" \
        --timeout 250 --cache-root "$CR/$step" --out "$OUT" "${REC[@]}" "${WW[@]}" ${EXTRA:-} 2>&1 | grep -v "^[a-z]" | tail -16 ;;
    profile)
      mkdir -p "$CR/tdefault/shard"
      FA4VERIFY_WORKER_PROFILE="$OUT/pstats" timeout "$left" python3 -m fa4verify audit --dtype bf16 --device cuda \
        --seed 0 --profile default --no-live --kernel-cache "$CR/tdefault/shard" --json "$OUT/audit_profiled.json" \
        > "$OUT/audit_profiled.log" 2>&1
      echo "profiled audit rc=$?"; tail -3 "$OUT/audit_profiled.log"
      python3 - "$OUT/pstats" > "$OUT/pstats_top.txt" <<'PY'
import pstats, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.pstats"))):
    print("=" * 30, os.path.basename(f))
    st = pstats.Stats(f); st.sort_stats("cumulative"); st.print_stats(28)
PY
      head -c 3000 "$OUT/pstats_top.txt" ;;
    imports)
      Z='import torch; from fa4verify.kernels.adapter import interface_module; interface_module(); import fa4verify.judge, fa4verify.oracles'
      for mode in alone beside; do
        [ "$mode" = beside ] && (python3 -c 'import torch; torch.cuda.is_available()' &)
        TIMEFORMAT="$mode: wall %R s, user %U s, sys %S s"
        time (env QUACK_ARCH=90 PYTORCH_NVML_BASED_CUDA_CHECK=1 python3 -X importtime -c "$Z" 2> "$OUT/importtime_$mode.txt")
        sort -t'|' -k2 -n "$OUT/importtime_$mode.txt" | tail -14 | cut -c1-110
        wait
      done ;;
    gputests) NX=(); python3 -c "import xdist" 2>/dev/null && NX=(-n "${GPU_TEST_WORKERS:-6}")
              timeout "$left" python3 -m pytest -q -m gpu "${NX[@]}" -rfEs -p no:cacheprovider tests > "$OUT/gpu_tests.log" 2>&1;
              tail -15 "$OUT/gpu_tests.log" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== $step rc=$? wall=$(( $(date +%s) - t ))s"
done
echo "call wall=$(( $(date +%s) - T0 ))s"
