#!/usr/bin/env bash
# Device-side driver of the consolidated production run (after part1 is unpacked, see
# scripts/gpu_run.sh for the split-bundle recipe). Stages (GPU_STAGES): audit, gputests, fuzz,
# mutants, replay, investigate. Results land in $OUT/final.tgz.
set -uo pipefail
test -d /root/site/nvidia_cutlass_dsl || { echo COLD; exit 3; }
if [ -f .devbundle/part2/p2.tar.xz ]; then
  tar -xJf .devbundle/part2/p2.tar.xz -C /root/site && cp .devbundle/part2/env.sh /root/site/
fi
. /root/site/env.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
R=$OUT/final; mkdir -p "$R"
STAGES=",${GPU_STAGES:-audit,gputests},"
stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 to=$2; shift 2
  case "$STAGES" in *",$name,"*) ;; *) return 0;; esac
  echo "=== $name"; local t0; t0=$(date +%s)
  timeout "$to" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; grep -v -i "warn" "$R/$name.log" | tail -${TAIL:-25}
}
stage audit "${T_AUDIT:-240}" fa4verify audit --dtype bf16 --device cuda --seed 0 \
  --json "$R/audit_h200.json" --junit "$R/audit_h200.xml" --html "$R/audit_h200.html"
stage investigate "${T_INVESTIGATE:-120}" python3 scripts/gpu_investigate_small_hd.py --json "$R/small_hd_h200.json"
stage hdsweep "${T_HDSWEEP:-300}" bash -c "python3 scripts/gpu_hd_sweep.py --json $R/hd_sweep_full_h200.json; python3 scripts/gpu_hd_sweep.py --causal --head-dims 8,16,24,32,40,48,56,64 --json $R/hd_sweep_causal_h200.json"
stage gputests "${T_GPUTESTS:-200}" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider ${PYTEST_ARGS:-} ${GPU_TESTS:-tests}
stage replay "${T_REPLAY:-90}" python3 scripts/gpu_replay_regressions.py --json "$R/regressions_h200.json"
stage fuzz "${T_FUZZ:-330}" fa4verify fuzz --target production --examples ${FUZZ_EXAMPLES:-240} --seed ${FUZZ_SEED:-0} --dtype bf16 \
  --head-dims ${FUZZ_HDIMS:-64,128} --time-limit ${FUZZ_LIMIT:-170} --json "$R/fuzz_h200.json" --cases-dir "$R/cases"
stage mutants "${T_MUTANTS:-150}" fa4verify mutants --target production --json "$R/mutants_h200.json" \
  --markdown "$R/mutants_h200.md"
tar -C "$OUT" -czf "$OUT/final-${GPU_TAG:-run}.tgz" final && rm -rf "$R"
ls -la "$OUT"
