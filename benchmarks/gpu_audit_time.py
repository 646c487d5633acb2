#!/usr/bin/env python3
"""Wall time of the GPU audit, per check, before and after the worker pool, in one run.

Runs ``fa4verify audit --dtype bf16 --device cuda --seed 0 --profile P --json ...`` as
subprocesses in these modes (``--modes``, comma-separated, in order):

* ``before``     ``--workers 1 --fresh-workers --kernel-cache off``: a new worker process per
                 isolated check, no compiled-kernel reuse (the runner of session 3);
* ``cold``       the defaults (``--workers auto``, persistent workers, FA4's kernel cache) with
                 an empty kernel cache (a fresh temporary directory);
* ``warm``       the defaults again with the cache ``cold`` filled (a second audit).

and prints one table: check id, then seconds per mode, then the audit's wall time, exit code
and verdict counts per mode; ``--recorded FILE`` adds a column from an earlier JSON report
(e.g. docs/results/h200_session3/audit_h200_default.json, labelled "recorded"). The verdicts
of the modes must agree (it says so when they do not). Usage::

    python3 benchmarks/gpu_audit_time.py --profile default --modes cold,warm --out DIR
    python3 benchmarks/gpu_audit_time.py --profile quick --modes before,cold,warm --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = {
    "before": ["--workers", "1", "--fresh-workers", "--kernel-cache", "off"],
    "cold": [],
    "warm": [],
}


def run_mode(mode: str, profile: str, out_dir: str, cache: str, extra: list[str],
             timeout: float) -> dict:
    js = os.path.join(out_dir, f"audit_{profile}_{mode}.json")
    args = [sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--device", "cuda",
            "--seed", "0", "--profile", profile, "--no-live", "--json", js, *MODES[mode], *extra]
    if mode != "before":
        args += ["--kernel-cache", cache]
    env = dict(os.environ)
    for k in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env.pop(k, None)          # the audit's own --kernel-cache decides
    t0 = time.perf_counter()
    with open(os.path.join(out_dir, f"audit_{profile}_{mode}.log"), "w") as log:
        try:
            rc = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    rep = {}
    if os.path.exists(js):
        with open(js) as f:
            rep = json.load(f)
    return {"mode": mode, "rc": rc, "wall_s": wall, "report": rep}


def _gpu_name(rep: dict) -> str | None:
    hw = rep.get("environment", {}).get("hardware", {}) or {}
    g = hw.get("gpu_name") or hw.get("gpu")
    if isinstance(g, list):
        g = g[0] if g else None
    if isinstance(g, dict):
        g = g.get("name")
    return g


def per_check(rep: dict) -> dict[str, tuple[float, str]]:
    return {r["id"]: (float(r.get("duration_s", 0.0)), r.get("status", "?"))
            for r in rep.get("results", [])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="default", choices=("quick", "default", "full"))
    ap.add_argument("--modes", default="before,cold,warm")
    ap.add_argument("--out", default=None, help="directory for the JSON reports and logs")
    ap.add_argument("--recorded", default=None, help="an earlier JSON report to add as a column")
    ap.add_argument("--timeout", type=float, default=560.0, help="per-audit limit (s)")
    ap.add_argument("extra", nargs="*", help="extra audit arguments (after --)")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"error: unknown mode(s) {bad}; choose from {list(MODES)}", file=sys.stderr)
        return 2
    out = a.out or tempfile.mkdtemp(prefix="fa4verify-audit-time-")
    os.makedirs(out, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="fa4verify-kernel-cache-")
    runs = [run_mode(m, a.profile, out, cache, a.extra, a.timeout) for m in modes]
    cols: list[tuple[str, dict]] = []
    if a.recorded:
        with open(a.recorded) as f:
            cols.append(("recorded", json.load(f)))
    cols += [(r["mode"], r["report"]) for r in runs]
    tables = [per_check(rep) for _, rep in cols]
    ids = list(dict.fromkeys(i for t in tables for i in t))
    gpu = next((_gpu_name(rep) for _, rep in cols if _gpu_name(rep)), None)
    print(f"fa4verify audit --profile {a.profile} --device cuda: wall seconds per check "
          f"(measured on {gpu or 'the local GPU'}; 'recorded' = {a.recorded})")
    head = f"{'check':44s}" + "".join(f"{name:>12s}" for name, _ in cols)
    print(head)
    print("-" * len(head))
    for i in ids:
        row = f"{i:44s}"
        for t in tables:
            v = t.get(i)
            row += f"{'-':>12s}" if v is None else f"{v[0]:8.1f} {v[1][:3]:>3s}"
        print(row)
    print("-" * len(head))
    walls = ["" if name == "recorded" else f"{r['wall_s']:.1f}" for (name, _), r in
             zip(cols, ([None] if a.recorded else []) + runs)]
    print(f"{'audit wall (s)':44s}" + "".join(f"{w:>12s}" for w in walls))
    for name, rep in cols:
        s = rep.get("summary", {})
        print(f"  {name:10s} exit {s.get('exit_code')} counts {s.get('counts')}")
    verdicts = [{k: v[1] for k, v in t.items()} for t in tables]
    agree = all(v == verdicts[-1] for v in verdicts[1 if a.recorded else 0:])
    print("verdicts of the modes run here agree" if agree else "VERDICTS DIFFER between modes")
    with open(os.path.join(out, f"audit_time_{a.profile}.json"), "w") as f:
        json.dump({"profile": a.profile, "gpu": gpu,
                   "runs": [{k: v for k, v in r.items() if k != "report"} for r in runs],
                   "per_check": {name: t for (name, _), t in zip(cols, tables)},
                   "verdicts_agree": agree}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
