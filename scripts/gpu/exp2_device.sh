#!/usr/bin/env bash
# Exhaustive device sweep of FA4's own exp2 device functions on the lent GPU (issue #17 item 2).
#
#   fa4verify exp2 --device cuda --degree all --jobs 16: for every degree 1-5, FA4's
#   ex2_emulation (and ex2_emulation_2, packed, on SM100/103) over every fp32 in [-127, 8] plus
#   the edge domain, bit for bit against the device twin; MUFU ex2.approx.ftz over [-126, 8]
#   scored against the correctly rounded fp32 2^x; plus the CPU twin certification of each degree
#   (16 cores). Exit 1 is expected: degrees 1 and 2 exceed emu_rel (a CPU-twin finding, not the
#   device); the device verdict is the "device" section (violations == [] when bit-identical).
#
# Run from the repo root; writes $OUT/exp2_device.json and $OUT/exp2_device.log.
# Expected wall time on the H200: ~60-90 s (6 probe compiles ~5 s each, ~1-2 s of device sweep
# per degree, ~2 s CPU certification per degree on 16 cores).
set -u
OUT="${OUT:-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
LOG="$OUT/exp2_device.log"
{
  echo "# exp2_device.sh $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | head -2
  "$PY" -c "import torch, flash_attn; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} >"$LOG"
t0=$(date +%s)
timeout 240 "$PY" -m fa4verify exp2 --device cuda --degree all --exhaustive --jobs 16 \
  --json "$OUT/exp2_device.json" >>"$LOG" 2>&1
rc=$?
t1=$(date +%s)
echo "# rc=$rc wall=$((t1 - t0)) s" >>"$LOG"
echo "exp2_device: rc=$rc (1 expected: degrees 1-2 exceed emu_rel), wall $((t1 - t0)) s"
if [ -f "$OUT/exp2_device.json" ]; then
  timeout 30 "$PY" - "$OUT/exp2_device.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
d = r.get("device") or {}
print(f"device: {d.get('where')}, {d.get('seconds_total')} s in all; violations: {d.get('violations')}")
for s in d.get("sweeps", []):
    sc = (s.get("scored") or {}).get("main") or {}
    print(f"  {s['function']} deg {s['degree']}: {s['n_inputs']:,} inputs, mismatches {s['mismatches']}, "
          f"{s['seconds']} s (+{s['compile_seconds']} s compile), max ulp {sc.get('max_ulp_fp32')} "
          f"(CPU {s.get('cpu_max_ulp_fp32')}), examples {s['examples'][:2]}")
m = d.get("mufu") or {}
print(f"  mufu: {m.get('n_inputs')} inputs, {m.get('seconds')} s, scored {m.get('scored')}")
for k, e in r.get("degrees", {}).items():
    print(f"  CPU twin deg {k}: {e.get('seconds')} s, max_rel {e.get('max_rel_error')}, max_ulp {e.get('max_ulp_fp32')}")
PYEOF
else
  echo "no JSON; tail of log:"; tail -20 "$LOG"
fi
