#!/usr/bin/env bash
# Session 5 (2026-12-01) on the lent H200, after the split-bundle recipe (../shared/device/README.md).
#   bash scripts/gpu_session5.sh STEP [STEP ...]
# Steps (each writes under $OUT/<step>/, guarded by its own timeout and by a 575 s call deadline):
#   exp2       scripts/gpu/exp2_device.sh       exhaustive device exp2 sweep vs the device twin (#17.2)
#   long       scripts/gpu/long_context.sh      32k / 128k certified fwd+bwd audit (#17.3, #17.5 smoke)
#   stat       scripts/gpu/stat_tier.sh         >= 1000 clean production problems, bias sweep (#15)
#   srcmut     scripts/gpu/source_mutants.sh    stage taps + production source mutants (#15)
#   tdefault   scripts/gpu/audit_time.sh default   audit wall time cold/warm vs session 3 (#17.1)
#   tquick     scripts/gpu/audit_time.sh quick     quick audit before/cold/warm (#17.1)
#   features   scripts/gpu/features.sh          paged KV, combine, block-sparse forward (#16)
#   sparse     scripts/gpu/features.sh sparse   the SM90 block-sparse backward prediction (#16.7)
#   gputests   pytest -m gpu                    the GPU tests
#   combine    scripts/gpu_combine_diag.py      flash_attn_combine: fp32 / bf16 / fp16 partials, alone and synchronous (#16.4)
#   mods       scripts/gpu/mods.sh              score_mod / mask_mod pairs fwd+bwd vs the oracle (#16.1)
#   seqused    scripts/gpu/features.sh seqused  seqused_k backward (#16)
#   fuzzfeat   fuzz.production drawing paged KV / seqused_k / block sparsity / mask_mod (#16.8)
#   hull       scripts/gpu/hull.sh               the hull fallback on fuzz.production's huge examples
#   multigpu   scripts/gpu/multigpu.sh          determinism --gpus all (1 GPU) + one-worker xdist smoke (#19, #17.5)
set -u
T0=$(date +%s)
DEADLINE=$((T0 + ${CALL_BUDGET_S:-575}))
test -f /root/site/env.sh || { echo COLD; exit 3; }
. /root/site/env.sh
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 4; }
test -f .fa4verify-commit && export FA4VERIFY_GIT_COMMIT="$(cat .fa4verify-commit)"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/root/fa4cache
mkdir -p /root/fa4cache
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
ROOT_OUT="$OUT"
for step in "$@"; do
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 30 ]; then echo "== $step: skipped, ${left}s left in this call"; continue; fi
  export OUT="$ROOT_OUT/$step"; mkdir -p "$OUT"
  t=$(date +%s)
  echo "== $step (limit ${left}s)"
  case "$step" in
    exp2)     timeout "$left" bash scripts/gpu/exp2_device.sh ;;
    long)     timeout "$left" bash scripts/gpu/long_context.sh ;;
    stat)     STAT_TIMEOUT=$((left - 10)) timeout "$left" bash scripts/gpu/stat_tier.sh ;;
    srcmut)   FA4V_SRCMUT_JOBS=12 timeout "$left" bash scripts/gpu/source_mutants.sh ;;
    hull)     timeout "$left" bash scripts/gpu/hull.sh ;;
    tdefault) (unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR;
               timeout "$left" bash scripts/gpu/audit_time.sh default) ;;
    tquick)   (unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR;
               timeout "$left" bash scripts/gpu/audit_time.sh quick) ;;
    features) timeout "$left" bash scripts/gpu/features.sh "paged combine sparse_fwd" ;;
    sparse)   SPARSE_HDS="${SPARSE_HDS:-128,200,208,224,232,240,256}" timeout "$left" bash scripts/gpu/features.sh sparse ;;
    pagednan) timeout "$left" python3 scripts/gpu_paged_empty_nan.py --json "$OUT/paged_empty_nan.json" 2>&1 | grep -v Warning | tail -8 ;;
    gputests) timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/gpu_tests.log" 2>&1;
              tail -15 "$OUT/gpu_tests.log" ;;
    combine)  timeout "$left" python3 scripts/gpu_combine_diag.py --json "$OUT/combine_diag.json" --timeout 60 ${COMBINE_ONLY:+--only $COMBINE_ONLY} 2>&1 | grep -v Warn | tail -20 ;;
    mods)     timeout "$left" bash scripts/gpu/mods.sh ;;
    seqused)  timeout "$left" bash scripts/gpu/features.sh seqused_bwd ;;
    fuzzfeat) timeout "$left" bash scripts/gpu/fuzz_features.sh ;;
    multigpu) timeout "$left" bash scripts/gpu/multigpu.sh ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== $step rc=$? wall=$(( $(date +%s) - t ))s"
done
echo "call wall=$(( $(date +%s) - T0 ))s"
