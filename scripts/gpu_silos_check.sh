#!/usr/bin/env bash
# GPU check of the silo split (fuzz/, mutants/, determinism/ packages; determinism backends on the
# target layer), on the lent H200. Usage, in the repository root after the bundle setup of
# shared/device/README.md:
#
#     bash scripts/gpu_silos_check.sh "$OUT"
#
# Runs (about 6-8 minutes on an H200, most of it FA4 JIT compiles):
#   1. the GPU tests of the moved code: tests/test_determinism_gpu.py, tests/test_mutants_production.py,
#      tests/test_fuzz_production.py, tests/test_gpu_determinism_smoke.py (pytest.log);
#   2. a short determinism run through the fa4 backend, now ProductionTarget.forward_tensors /
#      backward_tensors: configs h200, 10 runs x 2 fresh processes, 5 default runs, compared against
#      the recorded manifest kernels/evidence/determinism/h200_manifest.json (determinism.log, report.json).
# Every figure is "measured on <GPU> (sm_XY)"; exit status of each step is in summary.txt.
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/fa4v-silos-out}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUTDIR/gpu.txt" 2>&1 || true
git rev-parse HEAD >> "$OUTDIR/gpu.txt" 2>/dev/null || true
t0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_determinism_gpu.py \
    tests/test_mutants_production.py tests/test_fuzz_production.py tests/test_gpu_determinism_smoke.py \
    > "$OUTDIR/pytest.log" 2>&1
echo "pytest: exit $? ($(( $(date +%s) - t0 )) s)" | tee "$OUTDIR/summary.txt"
t1=$(date +%s)
WORK=$(mktemp -d /tmp/fa4v-silos-work.XXXXXX)
MAN=kernels/evidence/determinism/h200_manifest.json
AGAINST=(); [ -f "$MAN" ] && AGAINST=(--against "$MAN")
timeout 240 python3 -m fa4verify determinism --configs h200 --runs 10 --processes 2 --default-runs 5 \
    --devices 0 --time-budget 150 --json "$OUTDIR/report.json" --workdir "$WORK" "${AGAINST[@]}" \
    > "$OUTDIR/determinism.log" 2>&1
echo "determinism: exit $? ($(( $(date +%s) - t1 )) s)" | tee -a "$OUTDIR/summary.txt"
exit 0
