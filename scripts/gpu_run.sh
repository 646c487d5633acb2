#!/usr/bin/env bash
# Device-side driver of one GPU session: call 2 of the two-call bundle (../shared/device/README.md).
#
#   call 1 (carry .devbundle/part1):  mkdir -p /root/site && tar -xJf .devbundle/part1/p1.tar.xz -C /root/site
#   call 2 (carry .devbundle/part2):  bash scripts/gpu_run.sh
#
# When the working tree is over ~4 MiB (it is since the golden vectors are committed), part1
# (60 MB) plus the tree exceeds the 64 MiB a call may carry: split part1 here first,
#   split -b 31M .devbundle/part1/p1.tar.xz /tmp/p1_ && mkdir -p .devbundle/p1a .devbundle/p1b \
#     && mv /tmp/p1_aa .devbundle/p1a/ && mv /tmp/p1_ab .devbundle/p1b/
# and send three calls back to back (the device stays warm 30 s):
#   (carry .devbundle/p1a)  mkdir -p /root/site && cp .devbundle/p1a/p1_aa /root/p1.tar.xz
#   (carry .devbundle/p1b)  cat .devbundle/p1b/p1_ab >> /root/p1.tar.xz && tar -xJf /root/p1.tar.xz -C /root/site
#   (carry .devbundle/part2) FA4VERIFY_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_run.sh
#
# Stages (GPU_STAGES, comma list; default all): golden (scripts/gpu_golden.py -> golden vectors,
# mufu_stats.json), figures (benchmarks/gpu_production_figures.py), tests (pytest -m gpu on this
# issue's GPU tests, then the golden CI test). Everything lands in $OUT/results.tgz (one file).
set -uo pipefail
test -d /root/site/nvidia_cutlass_dsl || { echo COLD; exit 3; }
if [ -f .devbundle/part2/p2.tar.xz ]; then
  tar -xJf .devbundle/part2/p2.tar.xz -C /root/site && cp .devbundle/part2/env.sh /root/site/
fi
. /root/site/env.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
R=$OUT/r; mkdir -p "$R"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; head -15 "$R/nvidia-smi.txt"
STAGES=",${GPU_STAGES:-golden,figures,tests},"
stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 to=$2; shift 2
  case "$STAGES" in *",$name,"*) ;; *) return 0;; esac
  echo "=== $name"; local t0; t0=$(date +%s)
  timeout "$to" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; grep -v -i "warn" "$R/$name.log" | tail -${TAIL:-30}
}
stage golden "${T_GOLDEN:-150}" python3 scripts/gpu_golden.py --out "$R/golden"
stage figures "${T_FIGURES:-120}" python3 benchmarks/gpu_production_figures.py --json "$R/production_figures.json"
if [ -d "$R/golden" ]; then mkdir -p kernels/evidence/golden && cp "$R"/golden/* kernels/evidence/golden/; fi
stage tests "${T_TESTS:-170}" bash -c 'python3 -m pytest -m gpu -q -p no:cacheprovider -s \
  tests/test_gpu_probes.py tests/test_gpu_production.py tests/test_gpu_determinism_smoke.py; \
  python3 -m pytest -q -p no:cacheprovider tests/test_golden_twin.py tests/test_gpu_adapter_nocuda.py'
tar -C "$OUT" -czf "$OUT/results.tgz" r && rm -rf "$R"
ls -la "$OUT"
