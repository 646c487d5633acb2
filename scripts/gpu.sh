#!/usr/bin/env bash
# The one GPU driver: run the named steps on a CUDA machine with flash-attn-4 installed.
#
#   OUT=/path/to/results bash scripts/gpu.sh STEP [STEP ...]
#
# Each step writes under $OUT/<step>/, runs under its own timeout and under a call deadline
# (CALL_BUDGET_S, default 575 s: a step that would start with < 30 s left is skipped). When
# /root/site/env.sh exists (an offline device with a prepared site-packages) it is sourced and the
# checkout is installed with `pip install --no-deps --no-index -e .`; otherwise the current python3
# is used as is. FA4VERIFY_GIT_COMMIT is read from .fa4verify-commit when the device's copy has no
# git metadata. Steps:
#
#   audit          the default GPU audit: JSON, JUnit and HTML reports (audit.{json,xml,html,log})
#   checks         the default GPU audit of the checks AUDIT_K selects (-k expression; audit.{json,log})
#   source         the default GPU audit with --source-coverage: the FA4 lines its checks ran
#                  (source/source_coverage.{txt,json}, traces; AUDIT_K optional)
#   deploy:NAME    the audit under a shipped deployment profile (llama3-8b, small-hd, ...)
#   gputests       pytest -m gpu over GPU_TESTS (default tests/; e.g. "tests/test_races.py -k producer"), -n GPU_TEST_WORKERS (6)
#   golden         record golden vectors and MUFU statistics (scripts/gpu_golden.py)
#   figures        production forward/backward figures (benchmarks/gpu_production_figures.py)
#   exp2           exhaustive device exp2 sweep vs the device twin (scripts/gpu/exp2_device.sh)
#   long           32k / 128k certified forward + backward (scripts/gpu/long_context.sh)
#   stat           >= 1000 clean production problems and the bias sweep (scripts/gpu/stat_tier.sh)
#   srcmut         production stage taps and kernel-source mutants (scripts/gpu/source_mutants.sh)
#   hull           the hull fallback on fuzz.production's huge examples (scripts/gpu/hull.sh)
#   features       paged KV, combine, block-sparse forward (scripts/gpu/features.sh)
#   sparse         the SM90 block-sparse backward prediction (SPARSE_HDS)
#   seqused        seqused_k backward
#   mods           score_mod / mask_mod pairs forward + backward (scripts/gpu/mods.sh)
#   fuzzfeat       fuzz.production drawing paged KV / seqused_k / block sparsity / mask_mod
#   combine        flash_attn_combine with fp32 / bf16 / fp16 partials (scripts/gpu_combine_diag.py)
#   pagednan       the empty-sequence NaN page finding (scripts/gpu_paged_empty_nan.py)
#   predictions    the predicted SM90 defects (scripts/gpu_predictions.py)
#   investigate    the small-head-dim dQ finding (scripts/gpu_investigate_small_hd.py)
#   hdsweep        backward over every head dim, non-causal and causal (scripts/gpu_hd_sweep.py)
#   replay         replay tests/regressions/ on production FA4 (scripts/gpu_replay_regressions.py)
#   fuzz           a production fuzz campaign (FUZZ_EXAMPLES, FUZZ_SEED, FUZZ_HDIMS, FUZZ_LIMIT)
#   mutants        fa4verify mutants --target production
#   determinism    the determinism matrix (scripts/gpu_determinism.sh)
#   multigpu       determinism --gpus all + one-worker xdist smoke (scripts/gpu/multigpu.sh)
#   hygiene        the test markers on a GPU (scripts/gpu_hygiene.sh)
#   time:PROFILE[@N][:spawn|:fork]  (TIME_AUDIT_TIMEOUT: each audit's limit, 250 s)
#                  audit wall time, cold then warm, with the per-worker timeline
#                  (benchmarks/gpu_audit_time.py; --workers N; FA4VERIFY_WORKER_START)
#   profile        the default audit on time:default's warm cache, each worker request under cProfile
#                  (AUDIT_K: only those checks; PROFILE_WARMUP=1: one unprofiled run first fills the cache)
#   imports        python -X importtime of what an audit worker imports
#   tput           FA4 compile throughput, 1 / 8 / 15 processes (benchmarks/compile_throughput.py; TPUT_PROCS, TPUT_K)
#   workers        how the engine's workers start here (benchmarks/worker_start.py: fork or spawn)
#   parent         the audit parent's start: python -X importtime and wall of a one-check audit
#   seed:N         the default audit with --seed N on time:default's kernel cache (JSON)
#   quick          the quick audit on time:default's kernel cache (JSON)
#   planted:KIND[:ID,...]
#                  scripts/planted_faults.py --kind KIND --no-old (PLANTED_OPTS: extra --opt values)
#   tanh           the audit's live check mufu.tanh alone: tanh.approx on every fp32 input (its JSON)
#   bwds           how far the backward's P strays from 1 on one-hot huge-logit rows (scripts/gpu_bwd_s_consistency.py)
#   fuzzmany       fuzz.production alone through the audit on time:default's kernel cache, FUZZ_N examples
#                  (1000), FUZZ_T seconds at most (280), --seed FUZZ_SEED (7): the huge distribution included;
#                  FUZZ_DIST draws only the named value distributions (e.g. huge)
#   triage         replay a failing case and one-attribute variants of it (scripts/gpu_triage_case.py;
#                  TRIAGE_CASE: a case / audit JSON, default the seed-2 paged-KV row; TRIAGE_PROPERTY,
#                  TRIAGE_HDS, TRIAGE_PAGES: the head dims and page sizes varied; TRIAGE_ONLY: label prefixes of the variants to run; TRIAGE_DET: the case's backward
#                  mode, on or off, a variant runs the other)
#   srcmut:ID[,ID] the catalogue's source mutants (fa4verify.mutants.source) under the audit's MUT_CHECKS
#                  (default coverage.production or sequences.production; MUT_GPUS: the audit's --gpus), each copy with its own kernel
#                  cache (scripts/audit_mutants.py)
#   pguard         does FA4's backward preprocess write past its buffers / race? (scripts/gpu_preprocess_guard.py; PGUARD_REPS)
#   hang           the planted kernel hang (sm90_bwd_hd64_hang) under the audit (HANG_CHECKS, HANG_TIMEOUT)
#   hugemut        1/rowsum 2^-9 and D 2^-10 planted: fuzz.production on huge logits only and budgets.production.forward
#                  (its huge-logit statistical cases) (HUGEMUT_CHECKS, HUGEMUT_N, HUGEMUT_T, HUGEMUT_IDS)
#   releases       the default audit of older FA4 releases, each shadowing the installed one, a report
#                  each and the release table (scripts/gpu/releases.sh, Note [Release runs]; RELEASES,
#                  RELEASE_JOBS, RELEASE_CAP_S, RELEASE_MIN_S; scripts/release_table.py)
#
# Env: CALL_BUDGET_S (575), AUDIT_MODES (cold,warm), WORKERS, EXTRA (extra audit args for time:*),
#      AGAINST (time:*: then warm audits of this tree and of the tree in AGAINST alternating, ROUNDS times).
set -u
[ $# -gt 0 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2; }
: "${OUT:?set OUT to the results directory}"
T0=$(date +%s)
DEADLINE=$((T0 + ${CALL_BUDGET_S:-575}))
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
if [ -f /root/site/env.sh ]; then
  . /root/site/env.sh
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; exit 4; }
fi
test -f .fa4verify-commit && export FA4VERIFY_GIT_COMMIT="$(cat .fa4verify-commit)"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
nproc >> "$OUT/gpu.txt"
CR=${KERNEL_CACHE_ROOT:-/tmp/fa4verify-kcache}
ROOT_OUT="$OUT"
AUDIT=(python3 -m fa4verify audit --dtype bf16 --device cuda --seed 0)
for step in "$@"; do
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 30 ]; then echo "== $step: skipped, ${left}s left in this call"; continue; fi
  export OUT="$ROOT_OUT/${step//[:@]/_}"; mkdir -p "$OUT"
  t=$(date +%s)
  echo "== $step (limit ${left}s)"
  case "$step" in
    audit)    timeout "$left" "${AUDIT[@]}" --json "$OUT/audit.json" --junit "$OUT/audit.xml" \
                --html "$OUT/audit.html" > "$OUT/audit.log" 2>&1; echo "audit rc=$?"; tail -25 "$OUT/audit.log" ;;
    checks)   timeout "$left" "${AUDIT[@]}" -k "${AUDIT_K:?set AUDIT_K to the checks (-k expression)}" \
                --json "$OUT/audit.json" > "$OUT/audit.log" 2>&1; echo "audit rc=$?"; tail -25 "$OUT/audit.log" ;;
    source)   timeout "$left" "${AUDIT[@]}" ${AUDIT_K:+-k "$AUDIT_K"} --source-coverage "$OUT/source" \
                --json "$OUT/audit.json" > "$OUT/audit.log" 2>&1; echo "audit rc=$?"; tail -6 "$OUT/audit.log"
              (cd "$OUT/source" && rm -rf kernel-cache && tar czf traces.tgz traces && rm -rf traces) ;;
    deploy:*) timeout "$left" "${AUDIT[@]}" --deployment "${step#deploy:}" --json "$OUT/audit.json" \
                > "$OUT/audit.log" 2>&1; echo "audit rc=$?"; tail -12 "$OUT/audit.log" ;;
    gputests) NX=(); python3 -c "import xdist" 2>/dev/null && NX=(-n "${GPU_TEST_WORKERS:-6}")
              timeout "$left" python3 -m pytest -q -m gpu "${NX[@]}" -rfEs -p no:cacheprovider ${GPU_TESTS:-tests} \
                > "$OUT/gpu_tests.log" 2>&1; tail -15 "$OUT/gpu_tests.log" ;;
    golden)   timeout "$left" python3 scripts/gpu_golden.py --out "$OUT/golden" 2>&1 | tail -20 ;;
    figures)  timeout "$left" python3 benchmarks/gpu_production_figures.py --json "$OUT/production_figures.json" 2>&1 | tail -20 ;;
    exp2)     timeout "$left" bash scripts/gpu/exp2_device.sh ;;
    long)     timeout "$left" bash scripts/gpu/long_context.sh ;;
    stat)     STAT_TIMEOUT=$((left - 10)) timeout "$left" bash scripts/gpu/stat_tier.sh ;;
    srcmut)   FA4V_SRCMUT_JOBS=${FA4V_SRCMUT_JOBS:-12} timeout "$left" bash scripts/gpu/source_mutants.sh ;;
    hull)     timeout "$left" bash scripts/gpu/hull.sh ;;
    features) timeout "$left" bash scripts/gpu/features.sh "paged combine sparse_fwd" ;;
    sparse)   SPARSE_HDS="${SPARSE_HDS:-128,200,208,224,232,240,256}" timeout "$left" bash scripts/gpu/features.sh sparse ;;
    seqused)  timeout "$left" bash scripts/gpu/features.sh seqused_bwd ;;
    mods)     timeout "$left" bash scripts/gpu/mods.sh ;;
    fuzzfeat) timeout "$left" bash scripts/gpu/fuzz_features.sh ;;
    combine)  timeout "$left" python3 scripts/gpu_combine_diag.py --json "$OUT/combine_diag.json" --timeout 60 \
                ${COMBINE_ONLY:+--only $COMBINE_ONLY} 2>&1 | grep -v Warn | tail -20 ;;
    pguard)   timeout "$left" python3 scripts/gpu_preprocess_guard.py --json "$OUT/preprocess_guard.json" --reps "${PGUARD_REPS:-20}" 2>&1 | grep -v Warn | tail -12 ;;
    pagednan) timeout "$left" python3 scripts/gpu_paged_empty_nan.py --json "$OUT/paged_empty_nan.json" 2>&1 | grep -v Warning | tail -8 ;;
    predictions) timeout "$left" python3 scripts/gpu_predictions.py --json "$OUT/predictions.json" > "$OUT/predictions.log" 2>&1
              echo "predictions rc=$?"; tail -8 "$OUT/predictions.log" ;;
    investigate) timeout "$left" python3 scripts/gpu_investigate_small_hd.py --json "$OUT/small_hd.json" 2>&1 | tail -20 ;;
    hdsweep)  timeout "$left" bash -c "python3 scripts/gpu_hd_sweep.py --json $OUT/hd_sweep.json; python3 scripts/gpu_hd_sweep.py \
                --causal --head-dims 8,16,24,32,40,48,56,64 --json $OUT/hd_sweep_causal.json" 2>&1 | tail -20 ;;
    replay)   timeout "$left" python3 scripts/gpu_replay_regressions.py --json "$OUT/regressions.json" 2>&1 | tail -20 ;;
    fuzz)     timeout "$left" python3 -m fa4verify fuzz --target production --examples "${FUZZ_EXAMPLES:-240}" \
                --seed "${FUZZ_SEED:-0}" --dtype bf16 --head-dims "${FUZZ_HDIMS:-64,128}" --time-limit "${FUZZ_LIMIT:-170}" \
                --json "$OUT/fuzz.json" --cases-dir "$OUT/cases" > "$OUT/fuzz.log" 2>&1; echo "fuzz rc=$?"; tail -20 "$OUT/fuzz.log" ;;
    mutants)  timeout "$left" python3 -m fa4verify mutants --target production --json "$OUT/mutants.json" \
                --markdown "$OUT/mutants.md" > "$OUT/mutants.log" 2>&1; echo "mutants rc=$?"; tail -25 "$OUT/mutants.log" ;;
    determinism) DET_TIMEOUT=$((left - 5)) timeout "$left" bash scripts/gpu_determinism.sh "$OUT" ;;
    multigpu) timeout "$left" bash scripts/gpu/multigpu.sh ;;
    hygiene)  timeout "$left" bash scripts/gpu_hygiene.sh ;;
    time:*)
      spec=${step#time:}; prof=${spec%%[@:]*}; WW=()
      [ -n "${WORKERS:-}" ] && WW=(-- --workers "$WORKERS")
      case "$spec" in *@*) n=${spec#*@}; WW=(-- --workers "${n%%:*}") ;; esac
      case "$spec" in *:spawn) export FA4VERIFY_WORKER_START=spawn ;; *:fork) export FA4VERIFY_WORKER_START=fork ;;
                      *) unset FA4VERIFY_WORKER_START ;; esac
      rm -rf "$CR/$spec"; mkdir -p "$CR/$spec"
      (unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
       timeout "$left" python3 benchmarks/gpu_audit_time.py --profile "$prof" --modes "${AUDIT_MODES:-cold,warm}" \
         --timeout "${TIME_AUDIT_TIMEOUT:-250}" --cache-root "$CR/$spec" --out "$OUT" ${AGAINST:+--against "$AGAINST" --rounds "${ROUNDS:-2}"} \
         "${WW[@]}" ${EXTRA:-} 2>&1 | grep -v "^[a-z]" | tail -24) ;;
    profile)
      mkdir -p "$CR/default/shard"
      if [ -n "${PROFILE_WARMUP:-}" ]; then      # fill the kernel cache first: the profile then sees a warm audit
        timeout "$left" "${AUDIT[@]}" --profile default --no-live ${AUDIT_K:+-k "$AUDIT_K"} \
          --kernel-cache "$CR/default/shard" > "$OUT/audit_warmup.log" 2>&1; echo "warm-up rc=$?"
        left=$((DEADLINE - $(date +%s)))
        # timeout 0 would mean no limit at all
        if [ "$left" -lt 30 ]; then echo "profile: ${left}s left after the warm-up: not profiled"; continue; fi
      fi
      FA4VERIFY_PROFILE_DIR="$OUT/pstats" timeout "$left" "${AUDIT[@]}" --profile default --no-live \
        ${AUDIT_K:+-k "$AUDIT_K"} \
        --kernel-cache "$CR/default/shard" --json "$OUT/audit_profiled.json" > "$OUT/audit_profiled.log" 2>&1
      echo "profiled audit rc=$?"; tail -3 "$OUT/audit_profiled.log"
      python3 - "$OUT/pstats" > "$OUT/pstats_top.txt" <<'PY'
import glob, os, pstats, sys
# every request's profile summed (where the workers' seconds went), then the 12 longest requests alone
fs = sorted(glob.glob(os.path.join(sys.argv[1], "*.prof")))
if fs:
    allst = pstats.Stats(*fs)
    print("=" * 30, f"all {len(fs)} requests, by cumulative"); allst.sort_stats("cumulative").print_stats(70)
    print("=" * 30, "all requests, by own time"); allst.sort_stats("tottime").print_stats(40)
    longest = sorted(fs, key=lambda f: -pstats.Stats(f).total_tt)[:12]
    for f in longest:
        print("=" * 30, os.path.basename(f)); st = pstats.Stats(f); st.sort_stats("cumulative"); st.print_stats(40)
PY
      # summed above: the raw profiles would pass the transfer limit (kept when the summary failed)
      [ -s "$OUT/pstats_top.txt" ] && rm -rf "$OUT/pstats"
      head -c 3000 "$OUT/pstats_top.txt" ;;
    imports)
      Z='import torch; from fa4verify.kernels.adapter import interface_module; interface_module(); import fa4verify.judge, fa4verify.oracles'
      TIMEFORMAT="wall %R s, user %U s, sys %S s"
      time (env QUACK_ARCH=90 PYTORCH_NVML_BASED_CUDA_CHECK=1 python3 -X importtime -c "$Z" 2> "$OUT/importtime.txt")
      sort -t'|' -k2 -n "$OUT/importtime.txt" | tail -14 | cut -c1-110 ;;
    tput)     timeout "$left" python3 benchmarks/compile_throughput.py --procs "${TPUT_PROCS:-1,8,15}" --kernels "${TPUT_K:-4}" > "$OUT/tput.txt" 2>&1
              lscpu > "$OUT/lscpu.txt" 2>&1; cat "$OUT/tput.txt" | tail -8 ;;
    workers)  timeout "$left" python3 benchmarks/worker_start.py --workers "${WORKERS:-12}" > "$OUT/workers.txt" 2>&1
              tail -20 "$OUT/workers.txt" ;;
    parent)   mkdir -p "$CR/default/shard"
              TIMEFORMAT="parent one-check audit: wall %R s, user %U s, sys %S s"
              time (timeout "$left" python3 -X importtime -m fa4verify audit --dtype bf16 --device cuda -k budgets.files \
                --kernel-cache "$CR/default/shard" --json "$OUT/one.json" > "$OUT/one.log" 2> "$OUT/importtime.txt")
              grep -v "^import time" "$OUT/importtime.txt" | tail -5
              sort -t'|' -k2 -n "$OUT/importtime.txt" | tail -8 | cut -c1-110 ;;
    seed:*)   mkdir -p "$CR/default/shard"; n=${step#seed:}
              timeout "$left" python3 -m fa4verify audit --dtype bf16 --device cuda --seed "$n" --no-live \
                --kernel-cache "$CR/default/shard" --json "$OUT/audit_seed$n.json" > "$OUT/audit_seed$n.log" 2>&1
              echo "audit seed $n rc=$?"; grep -E "^(pass|fail|undecided|error) " "$OUT/audit_seed$n.log" | grep -v "^pass" | cut -c1-300
              tail -4 "$OUT/audit_seed$n.log" ;;
    quick)    mkdir -p "$CR/default/shard"
              timeout "$left" python3 -m fa4verify audit --dtype bf16 --device cuda --profile quick --no-live \
                --kernel-cache "$CR/default/shard" --json "$OUT/audit_quick.json" > "$OUT/audit_quick.log" 2>&1
              echo "quick rc=$?"; grep -E "^(pass|fail|undecided|error) " "$OUT/audit_quick.log" | cut -c1-200; tail -3 "$OUT/audit_quick.log" ;;
    planted:*) spec=${step#planted:}; kind=${spec%%:*}; ids=""; [ "$spec" != "$kind" ] && ids=${spec#*:}
              OPTS=(); for o in ${PLANTED_OPTS:-}; do OPTS+=(--opt "$o"); done
              timeout "$left" python3 scripts/planted_faults.py --kind "$kind" --no-old --out "$OUT" "${OPTS[@]}" ${ids//,/ } 2>&1 | tail -12 ;;
    tanh)     timeout "$left" "${AUDIT[@]}" -k mufu.tanh --no-live --json "$OUT/mufu_tanh.json" > "$OUT/mufu_tanh.log" 2>&1
              echo "mufu.tanh rc=$?"; grep -E "mufu.tanh" "$OUT/mufu_tanh.log" | cut -c1-400 | tail -3 ;;
    bwds)     timeout "$left" python3 scripts/gpu_bwd_s_consistency.py --target production --problems "${BWDS_PROBLEMS:-24}" \
                --json "$OUT/bwd_s_consistency.json" > "$OUT/bwd_s_consistency.log" 2>&1; echo "bwds rc=$?"; tail -8 "$OUT/bwd_s_consistency.log" | cut -c1-200 ;;
    fuzzmany) mkdir -p "$CR/default/shard"
              timeout "$left" python3 -m fa4verify audit --dtype bf16 --device cuda --seed "${FUZZ_SEED:-7}" --no-live \
                -k fuzz.production --opt fuzz_examples="${FUZZ_N:-1000}" --opt fuzz_time_limit_s="${FUZZ_T:-280}" \
                ${FUZZ_DIST:+--opt fuzz_distributions="$FUZZ_DIST"} \
                --kernel-cache "$CR/default/shard" --json "$OUT/fuzz_many.json" > "$OUT/fuzz_many.log" 2>&1
              echo "fuzzmany rc=$?"; grep -E "fuzz.production" "$OUT/fuzz_many.log" | cut -c1-600 | tail -4; tail -3 "$OUT/fuzz_many.log" ;;
    triage)   timeout "$left" python3 scripts/gpu_triage_case.py --case "${TRIAGE_CASE:-docs/results/h200/seeds/audit_seed2_failures.json}" \
                  --property "${TRIAGE_PROPERTY:-fwd_budget}" --head-dims "${TRIAGE_HDS:-64,128}" \
                  --page-sizes "${TRIAGE_PAGES:-8,32,64,128}" --deterministic "${TRIAGE_DET:-on}" --only "${TRIAGE_ONLY:-}" --json "$OUT/triage.json" 2>&1 | grep -v Warning | tail -40 ;;
    srcmut:*) ids=${step#srcmut:}; timeout "$left" python3 scripts/audit_mutants.py --out "$OUT" \
                --checks "${MUT_CHECKS:-coverage.production or sequences.production}" ${MUT_GPUS:+--gpus "$MUT_GPUS"} ${ids//,/ } 2>&1 | tail -12 ;;
    hang)     timeout "$left" python3 scripts/audit_mutants.py --out "$OUT" --checks "${HANG_CHECKS:-budgets.production}" \
                --timeout "${HANG_TIMEOUT:-60}" sm90_bwd_hd64_hang 2>&1 | tail -12 ;;
    hugemut)  timeout "$left" python3 scripts/audit_mutants.py --out "$OUT" \
                --checks "${HUGEMUT_CHECKS:-fuzz.production or budgets.production.forward}" --timeout default \
                --opt fuzz_distributions=huge --opt fuzz_examples="${HUGEMUT_N:-60}" --opt fuzz_time_limit_s="${HUGEMUT_T:-90}" \
                ${HUGEMUT_IDS:-clean recip_bias_2m9 dpsum_bias_2m10} 2>&1 | tail -12 ;;
    releases) RELEASE_DEADLINE=$DEADLINE bash scripts/gpu/releases.sh ;;
    *) echo "unknown step $step (bash scripts/gpu.sh with no argument lists the steps)" ;;
  esac
  echo "== $step rc=$? wall=$(( $(date +%s) - t ))s"
done
echo "call wall=$(( $(date +%s) - T0 ))s"
