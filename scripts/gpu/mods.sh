#!/usr/bin/env bash
# Issue 16 item 1 on the H200 (scripts/gpu_mods.py): every registered score_mod / mask_mod pair
# (ALiBi, rel-bias table, softcap, document, prefix-LM, sliding window, causal, checkerboard; ALiBi
# also causal) through FA4's forward + backward, bf16 hd 128, 2 x 1024 x 4 heads, judged against the
# float64 mod oracle (O, LSE, dQ, dK, dV); softcap-score_mod vs softcap=30, window mask_mod vs
# window_size=(128,0), causal mask_mod vs causal=True (bitwise and within budget).
#   bash scripts/gpu/mods.sh                 all pairs, 6 worker processes (~1.5-2.5 min with cold FA4 compiles, estimate)
#   MODS_PAIRS=alibi,softcap bash scripts/gpu/mods.sh     a subset
# Writes $OUT/features_mods.json (copy to docs/results/features/h200/ for the README table) and
# $OUT/features_mods.log; prints one summary line.
# MODS_DEVICE=cpu runs the CPU stand-in (tests only; not evidence).
set -u
: "${OUT:?set OUT to the output folder}"
extra=()
[ -n "${MODS_PAIRS:-}" ] && extra=(--pairs "$MODS_PAIRS")
timeout 300 python3 scripts/gpu_mods.py --json "$OUT/features_mods.json" --device "${MODS_DEVICE:-cuda}" \
  --workers "${MODS_WORKERS:-6}" --worker-timeout 280 ${extra[@]+"${extra[@]}"} > "$OUT/features_mods.log" 2>&1
r=$?
tail -n 1 "$OUT/features_mods.log"
[ $r -eq 124 ] && echo "[mods] TIMED OUT after 300s (partial log in features_mods.log)"
exit $r
