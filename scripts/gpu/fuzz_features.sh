#!/usr/bin/env bash
# Issue 16 item 8 on the H200: fuzz.production draws FA4's call forms (paged KV, seqused_k,
# block sparsity, the CuTe checkerboard mask_mod), every example judged by the one judge.
#   bash scripts/gpu/fuzz_features.sh          both steps (~2-3.5 min cold FA4 compiles, each step time-limited)
#   bash scripts/gpu/fuzz_features.sh audit    step 1 only: the audit check with the decode-paged profile
#   bash scripts/gpu/fuzz_features.sh keep     step 2 only: block sparsity + mask_mod + seqused_k campaign
# Step 1: `fa4verify audit -k fuzz.production --deployment decode-paged` (hd 128, GQA, paged KV at
# page sizes 16 and 128 = tile_n, seqused_k fwd+bwd, NaN page pool: the known issue
# sm90_paged_tma_empty_seq_nan must be counted, nothing else may fail), 24 examples, drawing
# stopped after 80 s. Step 2: scripts/gpu_fuzz_features.py at hd 64/128, 24 examples, 80 s.
# Writes $OUT/fuzzfeat_{audit.json,audit.log,keep.json,keep.log}; prints one summary line per step.
# FUZZFEAT_DEVICE=cpu runs step 2 on the CPU twin (tests only; not evidence).
set -u
steps="${1:-audit keep}"
: "${OUT:?set OUT to the output folder}"
rc=0
for s in $steps; do
  case "$s" in
    audit)
      timeout 200 python3 -m fa4verify audit --device cuda -k fuzz.production --deployment decode-paged \
        --opt fuzz_examples=24 --opt fuzz_time_limit_s=80 --json "$OUT/fuzzfeat_audit.json" \
        > "$OUT/fuzzfeat_audit.log" 2>&1
      r=$?
      python3 - "$OUT/fuzzfeat_audit.json" <<'PY' || tail -n 3 "$OUT/fuzzfeat_audit.log"
import json, sys
d = json.load(open(sys.argv[1]))
for c in d.get("checks", d.get("results", [])):
    if str(c.get("id", c.get("check", ""))).startswith("fuzz.production"):
        det = c.get("details", {})
        print("[audit fuzz.production decode-paged]", c.get("status"), "|", c.get("summary"), "| known:",
              {k: v.get("count") for k, v in det.get("known_issues", {}).items()}, "| unsupported:",
              det.get("unsupported"))
PY
      ;;
    keep)
      timeout 200 python3 scripts/gpu_fuzz_features.py --device "${FUZZFEAT_DEVICE:-cuda}" \
        --features block_sparse,mask_mod_fn,seqused_k --head-dims 64,128 --examples 24 --time-limit 80 \
        --json "$OUT/fuzzfeat_keep.json" > "$OUT/fuzzfeat_keep.log" 2>&1
      r=$?
      tail -n 1 "$OUT/fuzzfeat_keep.log"
      ;;
    *) echo "usage: $0 [audit|keep]" >&2; exit 2 ;;
  esac
  [ $r -ne 0 ] && rc=$r
  [ $r -eq 124 ] && echo "[$s] TIMED OUT (partial log in $OUT/fuzzfeat_$s.log)"
done
exit $rc
