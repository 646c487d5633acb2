#!/usr/bin/env bash
# Determinism run on the lent H200 (or any CUDA machine with flash-attn-4 installed).
#
# Usage, in the repository root on a CUDA machine with flash-attn-4 installed
# (". /root/site/env.sh; python3 -m pip install -q --no-deps --no-build-isolation --no-index -e ."):
#
#     bash scripts/gpu_determinism.sh "$OUT"
#
# Writes to OUTDIR: manifest.json (digest manifest), report.json (full report: per configuration
# status, digests, guard-band / NaN evidence, default-mode divergence, timing), determinism.log,
# gpu.txt (nvidia-smi), worker_logs.tgz. Knobs (environment): RUNS (100), PROCS (3),
# DEFAULT_RUNS (50), BUDGET (seconds per worker before remaining configurations are skipped, 170),
# DET_TIMEOUT (hard limit for the whole command, 300), CONFIGS (h200), DEVICES (all).
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/fa4v-det-out}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/fa4v-det-work.XXXXXX)
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
    --format=csv > "$OUTDIR/gpu.txt" 2>&1 || true
git rev-parse HEAD >> "$OUTDIR/gpu.txt" 2>/dev/null || true
t0=$(date +%s)
timeout "${DET_TIMEOUT:-300}" python3 -m fa4verify determinism \
    --configs "${CONFIGS:-h200}" --runs "${RUNS:-100}" --processes "${PROCS:-3}" \
    --default-runs "${DEFAULT_RUNS:-50}" --devices "${DEVICES:-all}" \
    --timing --timing-reps 10 --time-budget "${BUDGET:-170}" \
    --manifest "$OUTDIR/manifest.json" --json "$OUTDIR/report.json" --workdir "$WORK" \
    2>&1 | tee "$OUTDIR/determinism.log"
rc=${PIPESTATUS[0]}
echo "exit status: $rc; wall: $(( $(date +%s) - t0 )) s" | tee -a "$OUTDIR/determinism.log"
tar czf "$OUTDIR/worker_logs.tgz" -C "$WORK" . 2>/dev/null || true
exit 0
