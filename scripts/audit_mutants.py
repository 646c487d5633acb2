"""Run the audit against production source mutants (faults planted in private copies of the
installed FA4, fa4verify.mutants.source) and tabulate which check caught each.

    python scripts/audit_mutants.py --out DIR [--checks "coverage.production or sequences.production"] [--opt K=V] [--gpus all] ID [ID ...]

Each mutant: a private copy (the installed package is only read), PYTHONPATH pointing at it, a
kernel cache of its own (the unpatched kernels can never be served), then
``fa4verify audit --dtype bf16 --device cuda -k <checks> --json DIR/<id>.json``. ``clean`` runs
an unmutated copy (the control: it must pass). ``--timeout default`` leaves the per-task
deadline to the engine (Note [Default deadline]); a planted hang (``sm90_bwd_hd64_hang``) shows it.
Prints one line per mutant: exit code, the checks that failed, errored or were undecided, and
the engine's worker processes still alive after the audit returned (there must be none). With
``clean`` among the ids, each mutant is then CAUGHT or MISSED against it: what it found that the
control did not (a fault already present in the clean run hides nothing this way)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--checks", default="coverage.production or sequences.production")
    ap.add_argument("--timeout", default="180",
                    help="seconds per task (the audit's --timeout), or 'default': the engine's deadline")
    ap.add_argument("--opt", action="append", default=[], metavar="K=V",
                    help="passed to the audit as --opt (e.g. fuzz_distributions=huge)")
    ap.add_argument("--gpus", default=None, help="passed to the audit as --gpus (e.g. all: workers on every GPU)")
    ap.add_argument("ids", nargs="+")
    a = ap.parse_args()
    from fa4verify.mutants import source as S
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mid in a.ids:
        m = None if mid == "clean" else S.catalogue([mid])[0]
        work = Path(os.environ.get("TMPDIR", "/tmp")) / "fa4v-mutants" / mid
        copy = S.make_copy(m, work)
        env = dict(os.environ)
        env["PYTHONPATH"] = f"{work}{os.pathsep}{env.get('PYTHONPATH', '')}"
        rep = a.out / f"{mid}.json"
        cmd = [sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--device", "cuda", "-k", a.checks,
               "--kernel-cache", str(work / "kernel-cache"), "--json", str(rep)]
        if a.timeout != "default":
            cmd += ["--timeout", a.timeout]
        for o in a.opt:
            cmd += ["--opt", o]
        if a.gpus:
            cmd += ["--gpus", a.gpus]
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        dt = time.monotonic() - t0
        (a.out / f"{mid}.log").write_text(p.stdout + p.stderr)
        caught = []
        try:
            r = json.loads(rep.read_text())
            caught = [f"{x['id']}={x['status']}: {x.get('summary', '')[:300]}" for x in r["results"]
                      if x["status"] in ("fail", "undecided", "error")]
            # what each flagged check found, by name (compare with the control's: a summary shows
            # only its first violation, which a fault already in the clean run would hide)
            found = {x["id"]: _found(x.get("details") or {}) for x in r["results"]
                     if x["status"] in ("fail", "undecided", "error")}
        except Exception as e:  # noqa: BLE001
            caught, found = [f"no report: {e}"], {}
        left = _workers_alive()
        rows.append({"mutant": mid, "fingerprint": copy.fingerprint[:12], "exit": p.returncode,
                     "seconds": round(dt, 1), "flagged": caught, "found": found, "workers_left": left})
        names = "; ".join(f"{c}: rows {v['violating_rows']} edges {v['violating_edges']}" for c, v in found.items()
                          if v["violating_rows"] or v["violating_edges"])
        print(f"{mid}: exit {p.returncode} in {dt:.0f} s; " + (" | ".join(caught) or "nothing flagged")
              + (f"; violating {names}" if names else "") + f"; workers left: {left or 'none'}", flush=True)
    _against_control(rows)
    (a.out / "mutants.json").write_text(json.dumps(rows, indent=2))
    return 0


def _found(det: dict) -> dict:
    """What one flagged check found (its report's details): violating plan rows and edges, the
    count of violating examples and the first violation's problem (a summary names only that)."""
    pc = det.get("plan_coverage") or {}
    return {"violating_rows": sorted(pc.get("violating_rows", {}), key=int),
            "violating_edges": sorted(pc.get("violating_edges", {})),
            "violating_examples": det.get("violating_examples"),
            "first": (det.get("failure") or {}).get("describe")}


def _against_control(rows: list[dict]) -> None:
    """With ``clean`` among the runs, each mutant's ``caught``: True when what it found differs
    from the control's (a check flagged that the control did not, or a violating row, edge or
    count the control did not have), with ``new`` naming the difference; the control's own
    findings are FA4's or fa4verify's, not the mutant's. Without a control nothing is said."""
    ctl = next((r for r in rows if r["mutant"] == "clean"), None)
    if ctl is None:
        return
    none = _found({})

    def by_check(row: dict) -> dict:      # every flagged check, with what its report details say
        ids = (f.split("=", 1)[0] for f in row["flagged"])
        return {c: row["found"].get(c, none) for c in ids}
    base = by_check(ctl)
    for r in rows:
        if r is ctl:
            continue
        if any(c.startswith("no report") for c in r["flagged"] + ctl["flagged"]):
            r["caught"], r["new"] = None, ["no report to compare"]     # neither caught nor missed
            print(f"{r['mutant']}: UNDECIDED against the control (no report to compare)", flush=True)
            continue
        new = []
        for c, v in by_check(r).items():
            b = base.get(c)
            if b is None:
                new.append(f"{c} flagged")
                continue
            new += [f"{c} row {i}" for i in v["violating_rows"] if i not in b["violating_rows"]]
            new += [f"{c} edge {e}" for e in v["violating_edges"] if e not in b["violating_edges"]]
            n, nb = v["violating_examples"] or 0, b["violating_examples"] or 0
            if n > nb:
                new.append(f"{c} {n} violating examples (control {nb})")
            elif v.get("first") and v.get("first") != b.get("first"):
                new.append(f"{c} first violation on another problem: {str(v['first'])[:120]}")
        r["caught"], r["new"] = bool(new), new
        print(f"{r['mutant']}: {'CAUGHT' if new else 'MISSED'} against the control"
              + (f": {'; '.join(new[:4])}" if new else ""), flush=True)


def _workers_alive() -> list[str]:
    """``pid cmdline`` of every live engine process (zygote or worker) on this machine."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and ("fa4verify.run.zygote" in cmd or "fa4verify.run.worker" in cmd):
            out.append(f"{d.name} {cmd[:120]}")
    return out


if __name__ == "__main__":
    sys.exit(main())
