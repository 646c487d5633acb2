"""Benchmark: the CPU exhaustive exp2 certification (issue 17 item 4: <= 10 s per degree on 2 cores).

Usage::

    python benchmarks/exp2_cpu.py                          # degrees 3 and 5, [-127, 8], 2 jobs
    python benchmarks/exp2_cpu.py --degree 3 --repeats 5
    python benchmarks/exp2_cpu.py --no-full                # only the sub-range comparisons
    python benchmarks/exp2_cpu.py --no-sub --full-old      # full sweeps, new then reference kernels
    python benchmarks/exp2_cpu.py --no-sub --vs-commit 40a9f49   # new vs the module before session 5
    python benchmarks/exp2_cpu.py --sub-range=-0.5:-0.0625 --sub-range=0.015625:0.125

Prints, in one run (CPU twin, this machine; labelled with its load average):

1. per degree, the full certification sweep of [-127, 8] (``exp2_cert.sweep``, fast method,
   fused kernels, ``--jobs`` processes): wall seconds and CPU seconds (user+sys of this process
   and its workers), against the goal of 10 s;
2. on each sub-range, interleaved and repeated (``--repeats``, one process, medians): the fast
   method with the fused kernels ("new"), the fast method with the reference kernels (the code
   before session 5, "old"), and the direct sweep (every input evaluated) with both kernels;
   the ratios old/new (speed-up of the kernels on the same inputs) and direct/new, and whether
   the statistics are the same: new == old bit for bit (every Stats field), new == direct in
   counts and maxima (argmaxes may differ between tied inputs).

The machine may be shared: read the CPU seconds and the ratios (both sides measured under the same
load, interleaved) rather than the absolute wall time. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time


def _cpu() -> float:
    """user + sys CPU seconds of this process and its (reaped) worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _key(st) -> tuple:
    """Counts and maxima, which the fast and the direct method must agree on."""
    return (st.n, st.max_ulp32, st.wrong_bf16, st.wrong_f16, st.mono_violations, st.max_rel,
            st.max_ulp_bf16, st.max_ulp_f16, st.worst_wrong_bf16_ulp, st.worst_wrong_f16_ulp)


def _module_at(rev: str):
    """``fa4verify/exp2/cert.py`` as of git revision ``rev`` (read with ``git show``), imported as a
    separate module (it imports the current oracles and twin, which session 5 did not change)."""
    import importlib.util
    import subprocess
    import sys
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "-C", root, "show", f"{rev}:fa4verify/exp2/cert.py"], check=True,
                         capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="exp2_cert_"), f"exp2_cert_{rev}.py")
    with open(path, "w") as fh:
        fh.write(src)
    name = f"exp2_cert_at_{rev}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod            # the worker processes (fork) find it by name
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--jobs", type=int, default=2, help="processes for the full sweep (default 2)")
    ap.add_argument("--no-full", action="store_true", help="skip the full [-127, 8] sweeps")
    ap.add_argument("--full-old", action="store_true",
                    help="also run the full sweep with the reference kernels, right after each new one")
    ap.add_argument("--sub-range", action="append", default=None, metavar="LO:HI",
                    help="sub-range for the new/old/direct comparison (repeatable; default "
                         "-0.5:-0.0625 (buckets) and 0.015625:0.125 (runs + direct), 2^25.6 inputs)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions per sub-range")
    ap.add_argument("--no-direct", action="store_true", help="skip the direct sweeps of the sub-ranges")
    ap.add_argument("--no-sub", action="store_true", help="skip the sub-range comparisons")
    ap.add_argument("--vs-commit", default=None, metavar="REV",
                    help="also run the full sweep with fa4verify/exp2/cert.py as of git REV (e.g. 40a9f49, "
                         "before session 5), right after each new one, and compare every statistic")
    args = ap.parse_args()
    subs = [] if args.no_sub else (args.sub_range or ["-0.5:-0.0625", "0.015625:0.125"])

    import numpy as np
    from fa4verify import __version__
    from fa4verify.exp2 import cert as ec
    from fa4verify.kernels.fa4_params import load_params

    p = load_params()
    print(f"# exp2_cpu -- CPU twin; fa4 {p.fa4_version}, dsl {p.dsl_version}, numpy {np.__version__}, "
          f"fa4verify {__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"params: {p.source}")
    print(f"# load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")

    def run(d, lo, hi, **kw):
        ec._FIRST_ABOVE.clear()            # every run pays its own mpmath boundary look-ups
        ec._GRID_CACHE.clear()             # and its own (R1) grid, as a fresh CLI process does
        c0 = _cpu()
        r = ec.sweep(d, lo, hi, **kw)
        return r, _cpu() - c0

    old_mod = _module_at(args.vs_commit) if args.vs_commit else None
    if not args.no_full:
        print(f"\n{'full certification [-127, 8]':<34} {'wall s':>8} {'CPU s':>8} {'inputs':>15}  goal")
        for d in args.degree:
            r, c = run(d, -127.0, 8.0, method="fast", jobs=args.jobs)
            print(f"{f'degree {d}, fast, fused, {args.jobs} jobs':<34} {r.seconds:8.2f} {c:8.2f} "
                  f"{r.stats.n:15,d}  <= 10 s: {'yes' if r.seconds <= 10 else 'no'} "
                  f"(max fp32 ulp {r.stats.max_ulp32}, bf16 wrong {r.stats.wrong_bf16:,})")
            if args.full_old:
                ro, co = run(d, -127.0, 8.0, method="fast", jobs=args.jobs, impl="reference")
                same = repr(ec.asdict(r.stats)) == repr(ec.asdict(ro.stats)) and r.fallbacks == ro.fallbacks
                print(f"{f'degree {d}, fast, reference, {args.jobs} jobs':<34} {ro.seconds:8.2f} {co:8.2f} "
                      f"{ro.stats.n:15,d}  old/new {ro.seconds / r.seconds:.2f} wall, {co / max(c, 1e-9):.2f} CPU; "
                      f"bit for bit equal: {same}")
            if old_mod is not None:
                old_mod._FIRST_ABOVE.clear()
                old_mod._GRID_CACHE.clear()
                c0 = _cpu()
                rv = old_mod.sweep(d, -127.0, 8.0, method="fast", jobs=args.jobs)
                cv = _cpu() - c0
                same = repr(ec.asdict(r.stats)) == repr(ec.asdict(rv.stats)) and r.fallbacks == rv.fallbacks
                print(f"{f'degree {d}, fast, {args.vs_commit}, {args.jobs} jobs':<34} {rv.seconds:8.2f} {cv:8.2f} "
                      f"{rv.stats.n:15,d}  old/new {rv.seconds / r.seconds:.2f} wall, {cv / max(c, 1e-9):.2f} CPU; "
                      f"bit for bit equal: {same}")

    for spec in subs:
        lo, hi = ec.parse_range(spec)
        for d in args.degree:
            kinds = [("new", "fast", "fused"), ("old", "fast", "reference")]
            if not args.no_direct:
                kinds += [("direct new", "direct", "fused"), ("direct old", "direct", "reference")]
            times: dict = {k[0]: [] for k in kinds}
            res: dict = {}
            for _ in range(args.repeats):
                for name, method, impl in kinds:       # interleaved: each repetition runs all
                    w0 = time.perf_counter()
                    r, c = run(d, lo, hi, method=method, impl=impl, jobs=1)
                    times[name].append((time.perf_counter() - w0, c))
                    res[name] = r
            med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
                   for k, v in times.items()}
            n = res["new"].stats.n
            print(f"\ndegree {d}, sub-range [{lo:g}, {hi:g}] ({n:,} inputs = 2^{np.log2(n):.1f}; "
                  f"pieces {res['new'].pieces}); medians of {args.repeats}, 1 process:")
            print(f"  {'sweep':<12} {'wall s':>8} {'CPU s':>8} {'Minputs/CPU-s':>14}")
            for k, (w, c) in med.items():
                print(f"  {k:<12} {w:8.3f} {c:8.3f} {n / max(c, 1e-9) / 1e6:14.1f}")
            same_old = repr(ec.asdict(res["new"].stats)) == repr(ec.asdict(res["old"].stats)) \
                and res["new"].fallbacks == res["old"].fallbacks
            print(f"  old/new = {med['old'][0] / med['new'][0]:.2f} wall, {med['old'][1] / max(med['new'][1], 1e-9):.2f} CPU; "
                  f"statistics new == old bit for bit: {same_old}")
            if not args.no_direct:
                same_direct = _key(res["new"].stats) == _key(res["direct new"].stats)
                same_dd = repr(ec.asdict(res["direct new"].stats)) == repr(ec.asdict(res["direct old"].stats))
                print(f"  direct new/new = {med['direct new'][0] / med['new'][0]:.2f} wall; "
                      f"direct old/direct new = {med['direct old'][1] / max(med['direct new'][1], 1e-9):.2f} CPU; "
                      f"new == direct in counts and maxima: {same_direct}; direct new == direct old bit for bit: {same_dd}")
    print(f"\n# load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
