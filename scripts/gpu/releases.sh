#!/usr/bin/env bash
# The release table (issue 29): the default GPU audit (with sequences.production and
# races.production in it) of older FA4 releases, one after the other (RELEASE_JOBS side by
# side), each release's flash_attn shadowing the installed one. Run by `scripts/gpu.sh releases`
# on the device after the main bundle is installed (/root/site/env.sh sourced).
#
# Note [Release runs]
# -------------------
# * A release travels as its wheel in RELEASE_DIR (default .devbundle/releases/, a few hundred kB
#   each) when it runs on the installed stack (the CuTe DSL and quack of the main bundle: 4.0.0b27
#   and later take nvidia-cutlass-dsl>=4.6.2 and quack-kernels>=0.5.3). The wheel is unpacked into
#   $RELEASE_STATE/site/<release> and that directory goes first on PYTHONPATH: `flash_attn` and the
#   flash_attn_4-<release>.dist-info there shadow the installed ones, and the audit names the release
#   from that metadata (fa4verify.audit.environment.fa4_stack). Before the audit a metadata-only
#   check (no FA4 import) confirms the release seen is the one asked for; `scripts/release_table.py`
#   checks the report's release again.
# * A release that needs another stack (4.0.0b20..b26 pin nvidia-cutlass-dsl==4.6.0.dev0; quack
#   0.5.3 takes only that DSL) runs on a stack unpacked in /root/site-<release> (a two-part bundle
#   carried in chunks that ride along with other calls: scripts/gpu/stack_chunks.sh, whose `stage`
#   runs first here), which then replaces /root/site on PYTHONPATH: the stack's own release as it
#   is, and any release whose wheel pins the DSL that stack holds (b20..b26 on the b25 stack) with
#   its wheel's flash_attn before the stack. A wheel pinning a DSL that neither /root/site nor a
#   staged stack holds is not run (its row says so), never run on the wrong stack.
# * The installed release itself (4.0.0b36 in the main bundle) may be named: it runs as installed.
# * Each release has its own kernel cache ($RELEASE_STATE/kcache/<release>): FA4 keys its
#   persistent cache by a fingerprint of its own source, but a cache of one release is never
#   offered to another; and its own FA4VERIFY_CACHE_DIR, so nothing one release's audit stored
#   (Hypothesis examples included) is replayed in another's.
# * Deadline: a release starts only with RELEASE_MIN_S (default 170 s: one cold default audit
#   measured 142 s on the H200 for 4.0.0b36 with 12 workers, alone) before the call's deadline (RELEASE_DEADLINE, an epoch
#   second, given by gpu.sh); it runs under `timeout` min(RELEASE_CAP_S, time left - 10 s). A
#   release killed at its cap writes no report; its row says so, and its kernel cache stays: the
#   next call on the same warm machine runs it again (a release with a report is not re-run unless
#   RELEASE_FORCE=1), mostly from that cache.
# * Outputs under $OUT: table.md (scripts/release_table.py over every report so far),
#   releases.tgz (every release's JSON report, log and run record), progress.txt.
#
# Env: RELEASES (space or comma separated; default every wheel in RELEASE_DIR, newest first),
#      RELEASE_DIR, RELEASE_STATE (/tmp/fa4rel), RELEASE_JOBS (2; on a machine of several GPUs
#      the jobs take the GPUs in turn), RELEASE_WORKERS (cores / jobs),
#      RELEASE_CAP_S (330), RELEASE_MIN_S (170), RELEASE_DEADLINE, RELEASE_FORCE, RELEASE_EXTRA
#      (extra audit arguments).
set -u
OUT=${OUT:?set OUT}
ST=${RELEASE_STATE:-/tmp/fa4rel}
RD=${RELEASE_DIR:-.devbundle/releases}
DEADLINE=${RELEASE_DEADLINE:-$(( $(date +%s) + 575 ))}
JOBS=${RELEASE_JOBS:-2}
CAP=${RELEASE_CAP_S:-330}
MIN=${RELEASE_MIN_S:-170}
NCPU=$(nproc)
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')   # > 1: the releases run spread over the GPUs
W=${RELEASE_WORKERS:-$(( NCPU / JOBS > 1 ? NCPU / JOBS : 2 ))}
mkdir -p "$ST/site" "$ST/kcache" "$ST/runs" "$OUT"
unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
BASE_PYTHONPATH=${PYTHONPATH:-}
bash scripts/gpu/stack_chunks.sh stage | tee -a "$OUT/progress.txt"     # other stacks carried in chunks
installed=$(python3 -c "import importlib.metadata as m; print(m.version('flash-attn-4'))" 2>/dev/null)
installed_dsl=$(python3 -c "import importlib.metadata as m; print(m.version('nvidia-cutlass-dsl'))" 2>/dev/null)

rels=${RELEASES:-}
if [ -z "$rels" ]; then
  rels=$(ls "$RD"/flash_attn_4-*.whl 2>/dev/null | sed 's/.*flash_attn_4-\([^-]*\)-.*/\1/' | sort -V -r | tr '\n' ' ')
fi
rels=${rels//,/ }
[ -n "${rels// /}" ] || { echo "releases: no release named and no wheel in $RD"; exit 2; }
echo "releases: $rels (jobs $JOBS x $W workers, cap ${CAP}s, start only with >= ${MIN}s left; installed: ${installed:-none})" \
  | tee -a "$OUT/progress.txt"

# the PYTHONPATH under which release $1 runs, or a one-line reason (exit 1) why it cannot
release_path() {
  local rel=$1 whl site
  if [ -d "${STACK_ROOT:-/root}/site-$rel/nvidia_cutlass_dsl" ]; then      # its own stack (stack_chunks.sh)
    site=${STACK_ROOT:-/root}/site-$rel
    echo "$site:$site/nvidia_cutlass_dsl/dsl_packages:$site/nvidia_cutlass_dsl/python_packages"; return 0
  fi
  whl=$(ls "$RD"/flash_attn_4-"$rel"-*.whl 2>/dev/null | head -n 1)
  if [ -n "$whl" ]; then
    site=$ST/site/$rel
    if [ ! -d "$site/flash_attn" ]; then
      rm -rf "$site"; mkdir -p "$site"
      python3 -m zipfile -e "$whl" "$site" || { echo "cannot unpack $whl"; return 1; }
    fi
    # the DSL its metadata pins (==X): when the installed one is another, a staged stack with X
    need=$(python3 - "$site" <<'PY'
import glob, sys
from email.parser import Parser
for meta in glob.glob(sys.argv[1] + "/flash_attn_4-*.dist-info/METADATA"):
    for line in Parser().parsestr(open(meta).read()).get_all("Requires-Dist") or []:
        name, _, spec = line.partition("==")
        if name.strip().lower() == "nvidia-cutlass-dsl" and spec and ";" not in spec:
            print(spec.strip())
PY
)
    if [ -z "$need" ] || [ "$need" = "$installed_dsl" ]; then
      echo "$site${BASE_PYTHONPATH:+:$BASE_PYTHONPATH}"; return 0
    fi
    for s in "${STACK_ROOT:-/root}"/site-*/; do
      if [ -d "${s}nvidia_cutlass_dsl-$need.dist-info" ]; then
        s=${s%/}; echo "$site:$s:$s/nvidia_cutlass_dsl/dsl_packages:$s/nvidia_cutlass_dsl/python_packages"; return 0
      fi
    done
    echo "flash-attn-4 $rel pins nvidia-cutlass-dsl==$need (installed: ${installed_dsl:-none}) and no stack with it is staged (stack_chunks.sh)"
    return 1
  fi
  if [ "$rel" = "$installed" ]; then echo "$BASE_PYTHONPATH"; return 0; fi
  echo "no wheel $RD/flash_attn_4-$rel-*.whl, no /root/site-$rel and not the installed release ($installed)"
  return 1
}

# one release: its audit under a cap, its run record in $ST/runs/<rel>.txt
run_release() {
  local rel=$1 cap=$2 pp=$3 t0 rc seen
  t0=$(date +%s)
  seen=$(PYTHONPATH="$pp" python3 -c "import importlib.metadata as m; print(m.version('flash-attn-4'))" 2>&1 | tail -n 1)
  if [ "$seen" != "$rel" ]; then
    printf 'release=%s rc=preflight wall=0 cap=%s note=%s\n' "$rel" "$cap" "the metadata seen is flash-attn-4 $seen, not $rel" > "$ST/runs/$rel.txt"
    return
  fi
  mkdir -p "$ST/kcache/$rel"; chmod 700 "$ST/kcache/$rel"
  rm -f "$ST/$rel.json"
  PYTHONPATH="$pp" FA4VERIFY_CACHE_DIR="$ST/cache/$rel" timeout -k 15 "$cap" python3 -m fa4verify audit --dtype bf16 --device cuda --seed 0 --no-live \
    --workers "$W" --kernel-cache "$ST/kcache/$rel" --json "$ST/$rel.json" ${RELEASE_EXTRA:-} > "$ST/$rel.log" 2>&1
  rc=$?
  printf 'release=%s rc=%s wall=%s cap=%s workers=%s\n' "$rel" "$rc" "$(( $(date +%s) - t0 ))" "$cap" "$W" > "$ST/runs/$rel.txt"
}

pack() {
  python3 scripts/release_table.py --state "$ST" --markdown "$OUT/table.md" > /dev/null 2>> "$OUT/progress.txt"
  (cd "$ST" && tar czf "$OUT/releases.tgz" --ignore-failed-read $(ls *.json *.log runs/*.txt 2>/dev/null)) 2>/dev/null
}

declare -A PIDS=()
STARTED=0
for rel in $rels; do
  if [ -z "${RELEASE_FORCE:-}" ] && [ -s "$ST/$rel.json" ]; then
    echo "$rel: report from an earlier call kept (RELEASE_FORCE=1 re-runs)" | tee -a "$OUT/progress.txt"; continue
  fi
  while [ "${#PIDS[@]}" -ge "$JOBS" ]; do                 # a free slot
    wait -n 2>/dev/null
    for r in "${!PIDS[@]}"; do
      if ! kill -0 "${PIDS[$r]}" 2>/dev/null; then
        unset "PIDS[$r]"; echo "$(cat "$ST/runs/$r.txt" 2>/dev/null)" | tee -a "$OUT/progress.txt"; pack
      fi
    done
  done
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt "$MIN" ]; then
    echo "$rel: not started, ${left}s left in this call (< ${MIN}s)" | tee -a "$OUT/progress.txt"; continue
  fi
  cap=$(( left - 10 < CAP ? left - 10 : CAP ))
  if ! pp=$(release_path "$rel"); then
    printf 'release=%s rc=not-run wall=0 cap=0 note=%s\n' "$rel" "$pp" > "$ST/runs/$rel.txt"
    echo "$rel: not run: $pp" | tee -a "$OUT/progress.txt"; continue
  fi
  echo "$rel: started $(date -u +%T) (cap ${cap}s)" | tee -a "$OUT/progress.txt"
  if [ "${NGPU:-0}" -gt 1 ] && [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
    CUDA_VISIBLE_DEVICES=$(( STARTED % NGPU )) run_release "$rel" "$cap" "$pp" &
  else
    run_release "$rel" "$cap" "$pp" &
  fi
  PIDS[$rel]=$!; STARTED=$(( STARTED + 1 ))
done
for r in "${!PIDS[@]}"; do
  wait "${PIDS[$r]}"; echo "$(cat "$ST/runs/$r.txt" 2>/dev/null)" | tee -a "$OUT/progress.txt"
done
pack
python3 scripts/release_table.py --state "$ST" 2>&1 | cut -c1-400 | head -80
