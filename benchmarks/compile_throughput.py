#!/usr/bin/env python3
"""How fast this machine compiles FA4 kernels, one process at a time and many at once.

    python3 benchmarks/compile_throughput.py [--procs 1,8,15] [--arch sm_90a] [--kernels 4]

Each of ``P`` processes compiles the same ``--kernels`` FA4 forward kernels compile-only
(``fa4verify.compile.production.run_cases``: FA4's own trace, MLIR pipeline, NVVM and ptxas, no
launch, no kernel cache, its own DSL cache), for each ``P`` of ``--procs`` in turn. Prints the
machine's CPUs, and per ``P``: the wall, the kernels compiled, the mean seconds a kernel and the
kernels per second. A cold audit is bound by FA4's compiles over the engine's workers; this says
what one compile costs here and how far running ``P`` at once slows each (shared cores, caches,
memory bandwidth).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time


def _cpus() -> str:
    out = [f"os.cpu_count {os.cpu_count()}", f"affinity {len(os.sched_getaffinity(0))}"]
    try:
        text = open("/proc/cpuinfo").read()
        models = {ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")}
        cores = {ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("core id")}
        phys = {ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("physical id")}
        out.append(f"model {' / '.join(sorted(models))}")
        out.append(f"distinct (socket, core) ids >= {max(len(cores), 1) * max(len(phys), 1)}")
    except OSError:
        pass
    return "; ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,8,15", help="comma-separated process counts, run in turn")
    ap.add_argument("--arch", default="sm_90a", choices=("sm_90a", "sm_100a", "sm_103a"))
    ap.add_argument("--kernels", type=int, default=4, help="forward kernels each process compiles (1-8)")
    a = ap.parse_args()
    try:
        procs = [int(p) for p in a.procs.split(",") if p.strip()]
    except ValueError:
        print(f"--procs {a.procs!r}: expected comma-separated integers", file=sys.stderr)
        return 2
    if not procs or min(procs) < 1 or not 1 <= a.kernels <= 8:
        print("--procs must name counts >= 1 and --kernels lie in 1..8", file=sys.stderr)
        return 2
    from fa4verify.compile.production import CompileCase, run_cases
    shapes = [(128, False), (64, True), (96, False), (256, False), (192, True), (128, True), (64, False), (256, True)]
    cases = [CompileCase("forward", hd, causal, seqlen=512) for hd, causal in shapes[:a.kernels]]
    print(f"cpus: {_cpus()}")
    print(f"{a.kernels} forward kernels per process ({', '.join(c.label() for c in cases)}), {a.arch}, compile-only")
    print(f"{'procs':>5} {'wall s':>7} {'kernels':>7} {'s/kernel mean':>13} {'median':>7} {'max':>6} {'kernels/s':>9}")
    for p in procs:
        with tempfile.TemporaryDirectory(prefix="fa4tput-") as tmp:
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(p) as ex:
                runs = list(ex.map(lambda i: run_cases(a.arch, cases, workdir=os.path.join(tmp, str(i))), range(p)))
            wall = time.time() - t0
        secs = [r["seconds"] for run in runs for r in run["results"]]
        bad = [r["error"] for run in runs for r in run["results"] if not r["ok"]]
        if bad:
            print(f"{p:>5} a compile failed: {bad[0][:300]}")
            return 1
        spans = [run["wall_seconds"] - run["import_seconds"] for run in runs]
        print(f"{p:>5} {wall:7.1f} {len(secs):7d} {statistics.mean(secs):13.2f} {statistics.median(secs):7.2f} "
              f"{max(secs):6.2f} {len(secs) / max(spans):9.2f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
