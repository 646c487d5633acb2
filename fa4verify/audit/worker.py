"""Worker subprocess for isolated checks.

Two modes, one request format (:func:`build_request`: which module to import, which check, the
context):

* one-shot: ``python -m fa4verify.audit.worker REQUEST.json RESULT.json`` runs one check and
  writes ``{"result": ..., "notes": [...]}`` to RESULT atomically;
* serving: ``python -m fa4verify.audit.worker --serve --reply-fd N`` reads one JSON line per
  request on stdin (``{"request": ..., "result_path": ...}``), runs it, writes the result file
  atomically and then one line on file descriptor N. The process stays alive between checks, so
  its imports (torch, CUDA context, the CuTe DSL) and FA4's in-memory kernel cache are paid once
  per audit instead of once per check. :mod:`fa4verify.audit.pool` drives it.

If the process dies instead (abort, CUDA illegal address, OOM kill), no result appears and the
parent records an ``error`` with the signal and the last stderr line, then starts a new worker.
This module imports :mod:`fa4verify.audit.execute`, never the runner.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from fa4verify.audit.execute import context_from_dict, context_to_dict, execute
from fa4verify.audit.registry import CheckContext, CheckResult, CheckSpec

REQUEST_VERSION = 1

__all__ = ["build_request", "run_request", "main", "REQUEST_VERSION"]


def build_request(spec: CheckSpec, ctx: CheckContext) -> dict[str, Any]:
    mod = sys.modules.get(spec.module)
    entry = spec.module
    if spec.module.startswith("_fa4verify_ext.") and mod is not None:
        entry = getattr(mod, "__file__", None) or spec.module
    return {"version": REQUEST_VERSION, "check_id": spec.id, "module": entry,
            "ctx": context_to_dict(ctx)}


def run_request(req: dict[str, Any]) -> dict[str, Any]:
    """Load the check's module, run the check, return the JSON payload."""
    from fa4verify.audit.registry import load_module, registered

    ctx = context_from_dict(req["ctx"])
    try:
        if int(req.get("version", 0)) != REQUEST_VERSION:
            raise ValueError(f"request version {req.get('version')!r}, expected {REQUEST_VERSION}")
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
    return {"result": result.to_dict(), "notes": notes}


def _write(path: str, payload: dict[str, Any]) -> None:
    from fa4verify.audit.atomic import atomic_write_text
    sys.stdout.flush()
    sys.stderr.flush()
    atomic_write_text(path, json.dumps(payload, default=str))


def _serve(reply_fd: int) -> int:
    reply = os.fdopen(reply_fd, "w", buffering=1)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("op") == "exit":
            break
        sh = (msg["request"].get("ctx") or {}).get("shard") or [0, 1]
        label = msg["request"].get("check_id", "?") + (f"[{sh[0] + 1}/{sh[1]}]" if sh[1] > 1 else "")
        print(f"--- fa4verify worker: {label}", file=sys.stderr, flush=True)
        _write(msg["result_path"], run_request(msg["request"]))
        reply.write(json.dumps({"done": msg.get("seq")}) + "\n")
        reply.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "--serve" and argv[1] == "--reply-fd":
        return _serve(int(argv[2]))
    if len(argv) != 2 or argv[0].startswith("--"):
        print("usage: python -m fa4verify.audit.worker REQUEST.json RESULT.json\n"
              "       python -m fa4verify.audit.worker --serve --reply-fd N", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        req = json.load(f)
    _write(argv[1], run_request(req))
    return 0


if __name__ == "__main__":
    sys.exit(main())
