"""Benchmark: time of the exhaustive exp2 certification sweep (CPU twin).

Usage::

    python benchmarks/bench_exp2_sweep.py                    # fast sweep, degree 3, [-127, 8], 2 jobs
    python benchmarks/bench_exp2_sweep.py --degree 5 --jobs 1
    python benchmarks/bench_exp2_sweep.py --direct-range=-1:1 # also time --direct on a sub-range (note the =)
    python benchmarks/bench_exp2_sweep.py --direct-full       # the full --direct sweep (minutes)

Prints a table (seconds, inputs, inputs/s, which reduction covered how many inputs) and the
environment fingerprint, in one run: per degree the fast sweep's wall and CPU seconds (user+sys
of this process and its workers), and the ratio fast/direct on the --direct-range sub-range.
Goal (issue #17 item 4): the fast exhaustive sweep of [-127, 8] (~2.2e9 inputs) in <= 10 s per
degree on a 2-core machine. The machine may be shared: read the CPU seconds next to the wall
time. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import platform


def _key(st) -> tuple:
    """The integer figures and maxima two methods must agree on (weights are float sums)."""
    return (st.n, st.max_ulp32, st.wrong_bf16, st.wrong_f16, st.mono_violations, st.max_rel,
            st.max_ulp_bf16, st.max_ulp_f16)


def _cpu() -> float:
    """user + sys CPU seconds of this process and its (reaped) worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, nargs="+", default=[3])
    ap.add_argument("--range", default="all", help="neg | pos | all | LO:HI (default all = [-127, 8])")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--direct-range", default="-0.5:-0.45",
                    help="sub-range on which to time the --direct sweep too ('' to skip)")
    ap.add_argument("--direct-full", action="store_true", help="time the --direct sweep on the full range")
    args = ap.parse_args()

    import numpy as np
    from fa4verify import __version__
    from fa4verify.exp2 import cert as ec
    from fa4verify.kernels.fa4_params import load_params

    p = load_params()
    print(f"# bench_exp2_sweep -- CPU twin; fa4 {p.fa4_version}, dsl {p.dsl_version}, numpy {np.__version__}, "
          f"fa4verify {__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, params: {p.source}")
    lo, hi = ec.parse_range(args.range)
    rows = []
    cpu_rows = []

    def timed(*a, **kw):
        c0 = _cpu()
        r = ec.sweep(*a, **kw)
        return r, _cpu() - c0

    for d in args.degree:
        r, c = timed(d, lo, hi, method="fast", jobs=args.jobs)
        rows.append((f"fast deg{d} [{lo:g},{hi:g}]", r.seconds, r.stats.n, r.pieces))
        cpu_rows.append((d, r.seconds, c))
        if args.direct_range:
            dlo, dhi = ec.parse_range(args.direct_range)
            rd, cd = timed(d, dlo, dhi, method="direct", jobs=args.jobs)
            rows.append((f"direct deg{d} [{dlo:g},{dhi:g}]", rd.seconds, rd.stats.n, rd.pieces))
            rf, cf = timed(d, dlo, dhi, method="fast", jobs=args.jobs)
            rows.append((f"fast deg{d} [{dlo:g},{dhi:g}]", rf.seconds, rf.stats.n, rf.pieces))
            print(f"# degree {d} on [{dlo:g},{dhi:g}]: direct {rd.seconds:.2f} s ({cd:.2f} CPU-s), fast "
                  f"{rf.seconds:.2f} s ({cf:.2f} CPU-s): fast/direct = {rf.seconds / rd.seconds:.3f} wall, "
                  f"{cf / max(cd, 1e-9):.3f} CPU; same counts and maxima: {_key(rf.stats) == _key(rd.stats)}")
        if args.direct_full:
            rd = ec.sweep(d, lo, hi, method="direct", jobs=args.jobs)
            rows.append((f"direct deg{d} [{lo:g},{hi:g}]", rd.seconds, rd.stats.n, rd.pieces))
    for d, w, c in cpu_rows:
        print(f"# degree {d}, [{lo:g},{hi:g}], fast, {args.jobs} jobs: {w:.2f} s wall, {c:.2f} CPU-s "
              f"(user+sys incl. workers; {c / max(w, 1e-9):.2f} cores busy); goal <= 10 s per degree")
    print(f"{'sweep':<34} {'seconds':>9} {'inputs':>15} {'Minputs/s':>10}  pieces (inputs per reduction)")
    for name, sec, n, pieces in rows:
        print(f"{name:<34} {sec:9.2f} {n:15,d} {n / sec / 1e6:10.1f}  {pieces}")
    if args.direct_range and not args.direct_full:
        for name, sec, n, _ in rows:
            if name.startswith("direct"):
                rate = n / sec
                total = sum(r[2] for r in rows if r[0].startswith("fast deg") and f"[{lo:g},{hi:g}]" in r[0]) / len(args.degree)
                print(f"# extrapolated --direct time for [{lo:g},{hi:g}] at {rate / 1e6:.2f} Minputs/s: "
                      f"{total / rate:.0f} s ({args.jobs} jobs)")
                break


if __name__ == "__main__":
    main()
