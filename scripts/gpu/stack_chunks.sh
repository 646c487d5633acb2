#!/usr/bin/env bash
# Another FA4 stack (an older release's CuTe DSL and quack, Note [Release runs] in
# scripts/gpu/releases.sh) onto the device in chunks that ride along with other calls.
#
# A stack's two-part bundle (../shared/device/make_bundle.sh with OUT_DIR=...) is ~66 MB, more
# than one call may carry beside the working tree (64 MiB in all). `split` cuts it here into
# chunk folders of at most CHUNK_MB (default 30) each, every folder with the sha256 manifest of all
# chunks; each device call that has room carries one folder and runs `stage`, which copies the
# chunks it finds into /root/stacks/<release>/ (kept while the machine is warm) and, once every
# chunk of the manifest is there and checks, unpacks the stack into /root/site-<release>, where
# releases.sh finds it.
#
#   here:    bash scripts/gpu/stack_chunks.sh split 4.0.0b25 .devbundle/b25
#            -> .devbundle/stack-4.0.0b25/c1 .. cN (git-ignored under /.devbundle/)
#   device:  bash scripts/gpu/stack_chunks.sh stage      (from the repo root; releases.sh runs it too)
set -u
R=${STACK_ROOT:-/root}          # the device's /root (tests: a temporary directory)
B=${STACK_SRC:-.devbundle}      # where the chunk folders lie in the working tree
case "${1:-}" in
  split)
    rel=${2:?release}; src=${3:?bundle dir with part1/ and part2/}
    out=$B/stack-$rel
    [ -s "$src/part1/p1.tar.xz" ] && [ -s "$src/part2/p2.tar.xz" ] || { echo "split: $src/part1/p1.tar.xz or $src/part2/p2.tar.xz missing"; exit 2; }
    rm -rf "$out"; mkdir -p "$out/tmp"
    cat "$src/part1/p1.tar.xz" > "$out/tmp/p1.tar.xz"
    cp "$src/part2/p2.tar.xz" "$out/tmp/p2.tar.xz"
    # p1 cut into pieces, p2 whole: every piece is a chunk (applied in name order)
    (cd "$out/tmp" && split -b "${CHUNK_MB:-30}M" -d -a 2 p1.tar.xz p1.tar.xz. && rm p1.tar.xz)
    (cd "$out/tmp" && sha256sum p1.tar.xz.* p2.tar.xz > manifest.sha256)
    n=0; cur=""; size=0; lim=$(( ${CHUNK_MB:-30} * 1048576 ))
    for f in $(cd "$out/tmp" && ls p1.tar.xz.* p2.tar.xz); do
      s=$(stat -c %s "$out/tmp/$f")
      if [ -z "$cur" ] || [ $(( size + s )) -gt "$lim" ]; then n=$((n + 1)); cur="$out/c$n"; size=0; mkdir -p "$cur"; fi
      mv "$out/tmp/$f" "$cur/"; size=$(( size + s ))
    done
    for c in "$out"/c*; do cp "$out/tmp/manifest.sha256" "$c/"; done
    rm -rf "$out/tmp"
    du -sb "$out"/c* ;;
  stage)
    for d in "$B"/stack-*/; do
      [ -d "$d" ] || continue
      rel=$(basename "$d"); rel=${rel#stack-}
      mkdir -p "$R/stacks/$rel"
      for c in "$d"c*/; do [ -d "$c" ] && cp -f "$c"* "$R/stacks/$rel/"; done
    done
    for S in "$R"/stacks/*/; do
      [ -f "$S/manifest.sha256" ] || continue
      rel=$(basename "$S"); site=$R/site-$rel
      [ -f "$site/.complete" ] && { echo "stack $rel: in $site"; continue; }
      missing=$(cd "$S" && awk '{print $2}' manifest.sha256 | while read -r f; do [ -f "$f" ] || echo "$f"; done | tr '\n' ' ')
      if [ -n "$missing" ]; then echo "stack $rel: waiting for chunk(s) $missing"; continue; fi
      (cd "$S" && sha256sum -c --quiet manifest.sha256) || { echo "stack $rel: a chunk does not match its manifest"; continue; }
      rm -rf "$site"; mkdir -p "$site"
      if (cd "$S" && cat p1.tar.xz.* | tar -xJ -C "$site" && tar -xJf p2.tar.xz -C "$site"); then
        touch "$site/.complete"; rm -f "$S"/p1.tar.xz.* "$S"/p2.tar.xz; echo "stack $rel: unpacked in $site"
      else
        echo "stack $rel: unpacking failed"
      fi
    done ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
