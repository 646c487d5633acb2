"""Run one check function and describe a check context as JSON.

The one place a check is called (:func:`execute`: exceptions become ``error``, :class:`SkipCheck`
``skip``), shared by the in-process runner (:mod:`fa4verify.audit.runner`) and the worker
subprocess (:mod:`fa4verify.audit.worker`). Neither of those imports the other: the runner talks
to workers through :mod:`fa4verify.audit.pool`, which speaks the worker's JSON protocol.
"""
from __future__ import annotations

import traceback
from typing import Any

from fa4verify.audit.registry import CheckContext, CheckResult, CheckSpec, SkipCheck

__all__ = ["execute", "context_to_dict", "context_from_dict"]


def execute(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Call the check function; exceptions become ``error``, :class:`SkipCheck` ``skip``."""
    try:
        res = spec.func(ctx)
    except SkipCheck as e:
        return CheckResult(status="skip", summary=str(e) or "skipped by the check")
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit from a check is an error too
        tb = traceback.format_exc()
        return CheckResult(status="error", summary=f"{type(e).__name__}: {e}".strip()[:500],
                           details={"traceback": tb[-6000:]})
    if not isinstance(res, CheckResult):
        return CheckResult(status="error",
                           summary=f"check returned {type(res).__name__}, not CheckResult")
    return res


def context_to_dict(ctx: CheckContext) -> dict[str, Any]:
    """The JSON form of a check context (what a worker needs to rebuild it)."""
    return {"dtype": ctx.dtype, "arch": ctx.arch, "device": ctx.device, "profile": ctx.profile,
            "seed": ctx.seed, "check_id": ctx.check_id, "archs": list(ctx.archs),
            "options": dict(ctx.options), "deployment": ctx.deployment,
            "shard": [int(ctx.shard[0]), int(ctx.shard[1])]}


def context_from_dict(c: dict[str, Any]) -> CheckContext:
    return CheckContext(dtype=c["dtype"], arch=c["arch"], device=c["device"], profile=c["profile"],
                        seed=int(c["seed"]), check_id=c["check_id"], archs=tuple(c["archs"]),
                        options=dict(c.get("options", {})), deployment=c.get("deployment"),
                        shard=tuple(int(x) for x in c.get("shard", (0, 1))))
