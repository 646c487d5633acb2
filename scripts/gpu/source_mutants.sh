#!/usr/bin/env bash
# Production stage taps + production source mutants on the lent H200 (issue #15 items 3-5).
# Run from the repo root with $OUT set. Expected wall time: ~200-280 s (18 workers -- clean
# control + 17 mutants -- each compiling FA4's SM90 forward and backward for one causal
# (1, 1024, 2, 128) bf16 problem, 8 in parallel on 16 cores; then one CPU oracle judges all).
# Outputs: $OUT/source_mutants.json (every verdict, fingerprints, curves), source_mutants.txt
# (table), source_mutants.log (full log), stage_taps_control.json (the clean copy's tap verdicts).
set -u
: "${OUT:?set OUT}"
JOBS="${FA4V_SRCMUT_JOBS:-8}"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
timeout 560 python3 -m fa4verify.mutants.source_run --out "$OUT" --device cuda --jobs "$JOBS" \
    --shape 4,1024,2,128 --worker-timeout 400 --work "${TMPDIR:-/tmp}/fa4v-srcmut" \
    > "$OUT/source_mutants.log" 2>&1
rc=$?
python3 - "$OUT" <<'PY' || true
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
p = out / "source_mutants.json"
if not p.exists():
    print("no source_mutants.json"); sys.exit(0)
d = json.loads(p.read_text())
ctl = d["records"].get("control", {})
taps = {t: {v: o["status"] for v, o in row.items()} for t, row in ctl.get("verdicts", {}).items()}
(out / "stage_taps_control.json").write_text(json.dumps(taps, indent=2))
print("control stage taps (worst case):", {t: r.get("worst_case") for t, r in taps.items()})
m = d["records"].get("dpsum_bias_2m10", {}).get("verdicts", {})
print("dpsum 2^-10 D tap:", m.get("D", {}).get("worst_case"))
errs = {k: r.get("error") for k, r in d["records"].items() if r.get("status") != "ok"}
print("worker errors:", errs or "none")
print("missed by fa4verify:", d["missed_by_fa4verify"] or "none", "| control alarm:", d["control_alarm"],
      "| installed unchanged:", d["installed_unchanged"], "| wall", d["wall_s"], "s")
PY
tail -n 60 "$OUT/source_mutants.txt" 2>/dev/null || tail -n 40 "$OUT/source_mutants.log"
echo "source_mutants_run exit $rc"
