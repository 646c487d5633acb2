"""Plant faults in private copies of the installed FA4 and audit each copy twice: with the checks
meant to find them (the new checks) and with the rest of the audit (the old ones).

    python scripts/planted_faults.py --kind race --out DIR [--profile full] [--opt races_pdl=both] [ID ...]
    python scripts/planted_faults.py --kind key  --out DIR [ID ...]

``--kind race``: the dropped waits of the backward's launch chain (``fa4verify.races.RACE_MUTANTS``),
new checks ``races.production`` and ``census.pdl_waits``. ``--kind key``: compile-key faults in FA4's source
(``fa4verify.sequences.key.KEY_MUTANTS``, Note [Planted key faults]), new check
``sequences.production``. No ID: every mutant of the kind. ``clean`` (always run first) is an
unmutated copy: the control, which must pass. The old checks are ``-k "not <new>"`` over the
same profile (``--no-old`` leaves them out).

Each copy: the copy first on PYTHONPATH, a kernel cache of its own (the unpatched kernels can
never be served), ``fa4verify audit --dtype bf16 --device cuda --profile P -k EXPR --json``.
Prints one line per copy and selection (exit code, the checks that failed, errored or were
undecided) and writes ``DIR/planted.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

NEW = {"race": "races.production or census.pdl_waits", "key": "sequences.production"}


def catalogue(kind: str):
    if kind == "race":
        from fa4verify.races import RACE_MUTANTS
        return RACE_MUTANTS
    from fa4verify.sequences.key import KEY_MUTANTS
    return KEY_MUTANTS


def audit(work: Path, out: Path, name: str, keyword: str, profile: str, opts: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{work}{os.pathsep}{env.get('PYTHONPATH', '')}"
    rep = out / f"{name}.json"
    cmd = [sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--device", "cuda", "--profile", profile,
           "-k", keyword, "--kernel-cache", str(work / "kernel-cache"), "--json", str(rep)]
    for o in opts:
        cmd += ["--opt", o]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    (out / f"{name}.log").write_text(p.stdout + p.stderr)
    try:
        r = json.loads(rep.read_text())
        flagged = [f"{x['id']}={x['status']}: {x.get('summary', '')[:200]}" for x in r["results"]
                   if x["status"] in ("fail", "undecided", "error")]
        ran = len(r["results"])
        # a pass of the new check says what it ran (races.production: how many repetitions were poisoned)
        passed = " | ".join(x.get("summary", "")[:300] for x in r["results"] if x["id"] in keyword.split(" or ")
                            and x["status"] == "pass")
    except Exception as e:  # noqa: BLE001 - no report: the audit itself failed
        flagged, ran, passed = [f"no report: {e}"], 0, ""
    return {"copy": name, "checks": keyword, "exit": p.returncode, "seconds": round(dt, 1), "results": ran,
            "flagged": flagged, "passed": passed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(NEW), required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--opt", action="append", default=[], help="passed to the audit (e.g. races_pdl=both)")
    ap.add_argument("--no-old", action="store_true", help="audit each copy with the new check only")
    ap.add_argument("ids", nargs="*")
    a = ap.parse_args()
    from fa4verify.mutants import source as S
    by = {m.id: m for m in catalogue(a.kind)}
    bad = [i for i in a.ids if i not in by and i != "clean"]
    if bad:
        print(f"planted_faults: unknown {a.kind} mutant(s) {bad}; have {sorted(by)}", file=sys.stderr)
        return 2
    ids = ["clean"] + [i for i in (a.ids or list(by)) if i != "clean"]
    a.out.mkdir(parents=True, exist_ok=True)
    new = NEW[a.kind]
    rows = []
    for mid in ids:
        work = Path(os.environ.get("TMPDIR", "/tmp")) / "fa4v-planted" / a.kind / mid
        copy = S.make_copy(by.get(mid), work)
        for label, keyword in [("new", new)] + ([] if a.no_old else [("old", f"not ({new})")]):
            row = dict(audit(work, a.out, f"{mid}.{label}", keyword, a.profile, a.opt), mutant=mid, selection=label,
                       fingerprint=copy.fingerprint[:12])
            rows.append(row)
            print(f"{mid} [{label}: -k {keyword!r}]: exit {row['exit']} in {row['seconds']:.0f} s, {row['results']} "
                  f"checks; " + (" | ".join(row["flagged"]) or "nothing flagged")
                  + (f" (pass: {row['passed']})" if row["passed"] else ""), flush=True)
    (a.out / "planted.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
