"""Worker subprocess for isolated checks: ``python -m fa4verify.audit.worker REQUEST RESULT``.

REQUEST is a JSON file written by :func:`build_request` (which module to import, which check,
the context); the worker imports that one module, runs the check like the in-process runner
(exceptions -> ``error``), and writes ``{"result": ..., "notes": [...]}`` to RESULT atomically.
If the process dies instead (abort, CUDA illegal address, OOM kill), RESULT does not exist and
the parent records an ``error`` with the signal and the last stderr line.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from fa4verify.audit.registry import CheckContext, CheckSpec

REQUEST_VERSION = 1


def build_request(spec: CheckSpec, ctx: CheckContext) -> dict[str, Any]:
    mod = sys.modules.get(spec.module)
    entry = spec.module
    if spec.module.startswith("_fa4verify_ext.") and mod is not None:
        entry = getattr(mod, "__file__", None) or spec.module
    return {"version": REQUEST_VERSION, "check_id": spec.id, "module": entry,
            "ctx": {"dtype": ctx.dtype, "arch": ctx.arch, "device": ctx.device,
                    "profile": ctx.profile, "seed": ctx.seed, "check_id": ctx.check_id,
                    "archs": list(ctx.archs), "options": dict(ctx.options),
                    "deployment": ctx.deployment}}


def main(argv: list[str] | None = None) -> int:
    from fa4verify.audit.registry import CheckResult, load_module, registered
    from fa4verify.audit.runner import execute
    from fa4verify.audit.atomic import atomic_write_text

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m fa4verify.audit.worker REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        req = json.load(f)
    c = req["ctx"]
    ctx = CheckContext(dtype=c["dtype"], arch=c["arch"], device=c["device"], profile=c["profile"],
                       seed=int(c["seed"]), check_id=c["check_id"], archs=tuple(c["archs"]),
                       options=dict(c.get("options", {})), deployment=c.get("deployment"))
    try:
        load_module(req["module"])
        spec = registered().get(req["check_id"])
        if spec is None:
            raise LookupError(f"check {req['check_id']!r} not registered by {req['module']}")
    except Exception as e:  # import problems are the check's error, reported normally
        result = CheckResult(status="error", summary=f"worker could not load the check: "
                                                     f"{type(e).__name__}: {e}")
        notes: list[str] = []
    else:
        result = execute(spec, ctx)
        notes = list(ctx._notes)
    sys.stdout.flush()
    atomic_write_text(argv[1], json.dumps({"result": result.to_dict(), "notes": notes},
                                          default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
