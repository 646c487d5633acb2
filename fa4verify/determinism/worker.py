"""Fresh-process runner for ``fa4verify determinism``.

Started by :func:`fa4verify.determinism.spawn_workers` as
``python -m fa4verify.determinism.worker --spec SPEC.json --out OUT.json``: it loads the backend
named in the spec, runs every configuration on every device (see
:func:`fa4verify.determinism.run_worker_spec`) and writes its JSON record to ``--out`` after each
configuration. Exit status: 0 when the record was written (whatever the results), 2 when the spec
is unreadable or the backend cannot run here (no GPU, no adapter), 3 on an internal error.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4verify.determinism.worker",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="worker spec JSON (determinism.worker_spec)")
    ap.add_argument("--out", required=True, help="where to write the worker record (JSON)")
    a = ap.parse_args(argv)
    from fa4verify.determinism.schema import SCHEMA_WORKER
    from fa4verify.determinism.workers import run_worker_spec
    try:
        with open(a.spec) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as ex:
        print(f"determinism_worker: cannot read spec {a.spec!r}: {ex}", file=sys.stderr)
        return 2
    if spec.get("schema") != SCHEMA_WORKER:
        print(f"determinism_worker: {a.spec!r} is not a worker spec", file=sys.stderr)
        return 2
    rec = run_worker_spec(spec, a.out)
    if rec.get("fatal"):
        print(f"determinism_worker: {rec['fatal']}", file=sys.stderr)
        return 2 if rec.get("fatal_kind") == "environment" else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
