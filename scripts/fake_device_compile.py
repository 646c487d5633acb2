"""Compile, on a fake GPU (compile-only, Note [Fake device audit]), the FA4 calls the default audit's
``coverage.production`` makes for the plan cases whose problem has a named property -- a subset of
the complete fake-device audit (``tests/test_fake_device_audit.py``'s ``FA4VERIFY_SLOW`` test, which
compiles every case of every check and takes about an hour on 2 cores).

    python scripts/fake_device_compile.py --device b200 --only masked_lists --json out.json

``--only``: an attribute of :class:`fa4verify.problem.AttentionProblem` (a property or field) that is
true for the cases to compile, e.g. ``masked_lists`` (block lists under causal / a window), ``sink``,
``varlen``. One line per compile call (the campaign's one call per FA4 compile key, the backward with
its dLSE variant where the check runs it), then the counts; exit 1 when a call errors. Nothing
launches: what this shows is that FA4 traces and compiles the calls for that GPU, not their values.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="b200", help="the fake GPU (b200, b300, h200)")
    ap.add_argument("--only", required=True, help="an AttentionProblem attribute true for the cases to compile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every call's record here")
    a = ap.parse_args(argv)
    from fa4verify.compile.production import _run_call, enter_fake_device
    try:
        enter_fake_device(a.device)
    except ValueError as e:
        print(f"fake_device_compile: {e}", file=sys.stderr)
        return 2
    from fa4verify.audit.registry import CheckContext
    from fa4verify.checks.coverage import _production_cases
    from fa4verify.checks.fuzz import campaign_compiles
    from fa4verify.kernels.device import local_gpu
    from fa4verify.problem import AttentionProblem
    if not hasattr(AttentionProblem, a.only) and a.only not in AttentionProblem.__dataclass_fields__:
        print(f"fake_device_compile: --only {a.only!r} is not an AttentionProblem attribute", file=sys.stderr)
        return 2
    gpu = local_gpu()
    ctx = CheckContext(arch=gpu.arch, seed=a.seed, profile="default", check_id=f"coverage.production[{gpu.arch}]",
                       device="cuda")
    t0 = time.time()
    cases = _production_cases(ctx)
    chosen = [c for c in cases if getattr(c.problem, a.only)]
    calls = campaign_compiles(chosen)
    print(f"{gpu.name} (compile-only): {len(cases)} coverage.production cases, {len(chosen)} with {a.only}, "
          f"{len(calls)} compile calls ({time.time() - t0:.0f} s to plan)", flush=True)
    out = []
    for c in calls:
        try:
            r = dict(_run_call(ctx, c), ok=True)
        except Exception as e:  # noqa: BLE001 - a call that fails to compile is the finding
            r = {"call": c.describe(), "ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        out.append(r)
        print(json.dumps({k: r.get(k) for k in ("call", "ok", "refused", "error", "seconds")}), flush=True)
    done = sum(r["ok"] and not r.get("refused") for r in out)
    refused = sum(bool(r.get("refused")) for r in out)
    errors = sum(not r["ok"] for r in out)
    print(f"{done} compiled, {refused} refused by FA4, {errors} errors; {time.time() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": gpu.name, "where": "compile-only", "only": a.only, "seed": a.seed,
                       "cases": len(chosen), "calls": out}, f, indent=1, default=str)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
