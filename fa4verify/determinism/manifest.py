"""Digest manifests: the recorded digests of a reproducible run with the environment they hold for,
and the comparison of a run against one."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Literal, Mapping

from fa4verify.determinism.schema import SCHEMA_MANIFEST

#: environment fields that make up the manifest's environment key
ENV_KEY_FIELDS = ("gpu", "compute_capability", "driver", "cuda", "torch", "fa4", "dsl", "backend",
                  "arch", "numpy", "mutations")


def environment_key(env: Mapping[str, str]) -> dict[str, str]:
    return {k: str(env[k]) for k in ENV_KEY_FIELDS if k in env}


def build_manifest(report: Mapping[str, Any], environment: Mapping[str, str], *,
                   provenance: Mapping[str, Any] | None = None) -> dict:
    """The digest manifest: environment key + per configuration (key = name, features, shape,
    dtype, seed) the digests of dQ, dK, dV, dsink of the deterministic backward -- only for
    configurations whose digests agreed across every run, process and device."""
    entries = {}
    for c in report["configs"]:
        if c["status"] not in ("reproducible", "xpass"):
            continue
        entries[c["key"]] = {"config": c["config"], "digests": c["digests"],
                             "shapes": c.get("shapes", {}),
                             "inputs_digest": c.get("inputs_digest"),
                             "fwd_digests": c.get("fwd_digests"),
                             "runs": c.get("total_runs"), "processes": len(c["processes"]),
                             "devices": c["devices"]}
    return {"schema": SCHEMA_MANIFEST, "environment": dict(environment),
            "environment_key": environment_key(environment),
            "provenance": dict(provenance or {}), "entries": entries}


def load_manifest(path: str) -> dict:
    """Read and check a manifest; ValueError with the reason if it is not one."""
    try:
        with open(path) as f:
            m = json.load(f)
    except OSError as ex:
        raise ValueError(f"cannot read manifest {path!r}: {ex.strerror}") from None
    except json.JSONDecodeError as ex:
        raise ValueError(f"manifest {path!r} is not JSON: {ex}") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA_MANIFEST:
        raise ValueError(f"{path!r} is not a determinism manifest (schema "
                         f"{m.get('schema') if isinstance(m, dict) else None!r}, expected "
                         f"{SCHEMA_MANIFEST!r})")
    if not isinstance(m.get("entries"), dict) or not isinstance(m.get("environment_key"), dict):
        raise ValueError(f"manifest {path!r} lacks 'entries' or 'environment_key'")
    return m


Outcome = Literal["match", "mismatch", "different-environment", "inputs-differ",
                  "only-current", "only-reference"]


def compare_manifests(current: Mapping[str, Any], reference: Mapping[str, Any], *,
                      strict_env: bool = False) -> dict:
    """Compare two manifests entry by entry.

    Per entry: ``match`` (every digest equal), ``mismatch`` (listing the tensors whose digests
    differ) when the environment keys are equal or ``strict_env``, ``different-environment`` when
    they differ (reported, not a failure), ``inputs-differ`` (the inputs' digests differ, so the
    outputs cannot be compared), ``only-current`` / ``only-reference``. The verdict is
    ``mismatch`` if any entry mismatches, else ``different-environment`` if any entry could only
    be compared across environments with differing results, else ``match``; ``failed`` is True
    for ``mismatch`` only.
    """
    ek_c, ek_r = current["environment_key"], reference["environment_key"]
    env_diff = {k: [ek_c.get(k), ek_r.get(k)] for k in sorted(set(ek_c) | set(ek_r))
                if ek_c.get(k) != ek_r.get(k)}
    same_env = not env_diff
    entries = []
    ce, re_ = current["entries"], reference["entries"]
    for key in sorted(set(ce) | set(re_)):
        if key not in re_:
            entries.append({"key": key, "outcome": "only-current"})
            continue
        if key not in ce:
            entries.append({"key": key, "outcome": "only-reference"})
            continue
        a, b = ce[key], re_[key]
        if a.get("inputs_digest") and b.get("inputs_digest") and \
                a["inputs_digest"] != b["inputs_digest"]:
            entries.append({"key": key, "outcome": "inputs-differ"})
            continue
        diff = sorted(t for t in set(a["digests"]) | set(b["digests"])
                      if a["digests"].get(t) != b["digests"].get(t))
        if not diff:
            entries.append({"key": key, "outcome": "match"})
        elif same_env or strict_env:
            entries.append({"key": key, "outcome": "mismatch", "tensors": diff})
        else:
            entries.append({"key": key, "outcome": "different-environment", "tensors": diff})
    outs = {e["outcome"] for e in entries}
    if "mismatch" in outs:
        verdict = "mismatch"
    elif "different-environment" in outs or (not same_env and "match" not in outs):
        verdict = "different-environment"
    elif "match" in outs:
        verdict = "match"
    else:
        verdict = "nothing-compared"
    return {"verdict": verdict, "failed": verdict == "mismatch",
            "same_environment": same_env, "environment_diff": env_diff,
            "strict_env": strict_env, "entries": entries,
            "counts": {o: sum(1 for e in entries if e["outcome"] == o) for o in sorted(outs)}}


def git_commit(path: str | None = None) -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=path or os.path.dirname(os.path.abspath(__file__)), timeout=10)
        out = r.stdout.strip()
        return out if r.returncode == 0 and len(out) == 40 and all(
            ch in "0123456789abcdef" for ch in out) else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
