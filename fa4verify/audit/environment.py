"""What the audit ran on: package versions, Python, OS, CPU, and the GPU/driver if any.

Versions come from installed distribution metadata (no heavy import); torch is imported only
when the audit runs on a CUDA device, to read the GPU name, capability and CUDA version.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

DISTRIBUTIONS = {
    "fa4verify": "fa4verify",
    "flash-attn-4": "FA4",
    "nvidia-cutlass-dsl": "CuTe DSL",
    "torch": "torch",
    "numpy": "numpy",
    "mpmath": "mpmath",
    "gmpy2": "gmpy2",
    "triton": "triton",
}


from fa4verify.kernels.facts import dist_version  # noqa: E402  (the one lookup)


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except Exception:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import torch

        if not torch.cuda.is_available():
            return info
        i = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(i)
        info.update(gpu_name=p.name, gpu_capability=f"{p.major}.{p.minor}",
                    gpu_count=torch.cuda.device_count(), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                    gpu_sms=getattr(p, "multi_processor_count", None), cuda_runtime=torch.version.cuda)
    except Exception as e:  # pragma: no cover - only on GPU machines
        info["gpu_error"] = f"{type(e).__name__}: {e}"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                info["driver"] = out.stdout.strip().splitlines()[0]
        except Exception:  # pragma: no cover
            pass
    return info


#: the distributions flash-attn-4's metadata pins that decide its kernels (docs/howto.md: auditing
#: an older release)
STACK = ("nvidia-cutlass-dsl", "quack-kernels")


def fa4_stack(requires: dict[str, list[str]] | list[str] | None = None,
              installed: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The FA4 release and its stack: ``{"release", "installed": {dist: version}, "requires":
    {dist: specifier}, "mismatch": [one line per requirement not met]}``. The requirements are
    the ``Requires-Dist`` lines of the installed flash-attn-4 and quack-kernels metadata on the
    distributions of :data:`STACK` (quack pins the DSL too: quack-kernels 0.5.3 takes only
    nvidia-cutlass-dsl 4.6.0.dev0, 0.6.5 needs >= 4.7). ``requires`` ({dist: lines}, or FA4's
    lines) / ``installed`` replace the metadata lookups (tests)."""
    import importlib.metadata
    release = dist_version("flash-attn-4")
    if installed is None:
        installed = {d: dist_version(d) for d in STACK}
    if requires is None or isinstance(requires, list):
        given = requires
        requires = {}
        for dist in ("flash-attn-4",) + STACK:
            if dist == "flash-attn-4" and given is not None:
                requires[dist] = list(given)
                continue
            if given is not None:     # FA4's lines given: the others from ``installed`` only
                continue
            try:
                requires[dist] = list(importlib.metadata.requires(dist) or [])
            except importlib.metadata.PackageNotFoundError:
                pass
    out: dict[str, Any] = {"release": release, "installed": dict(installed), "requires": {}, "mismatch": []}
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging ships with pip
        return out
    for who, lines in requires.items():
        who_v = release if who == "flash-attn-4" else installed.get(who)
        for line in lines:
            try:
                req = Requirement(line)
            except Exception:  # noqa: BLE001 - a metadata line packaging cannot read is not ours to judge
                continue
            name = req.name.lower()
            if name not in STACK or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
                continue
            spec = str(req.specifier)
            if who == "flash-attn-4":
                out["requires"][name] = spec
            have = installed.get(name)
            if have is None:
                out["mismatch"].append(f"{name} not installed; {who} {who_v} requires {name}{spec}")
            elif spec and not req.specifier.contains(have, prereleases=True):
                out["mismatch"].append(f"{name} {have} installed; {who} {who_v} requires {name}{spec}")
    return out


def stack_line(stack: dict[str, Any]) -> str:
    """One line naming the FA4 release and its stack, and saying whether the stack matches."""
    if not stack.get("release"):
        return "FA4: flash-attn-4 not installed"
    inst = stack.get("installed") or {}
    head = (f"FA4 release: flash-attn-4 {stack['release']} (" +
            ", ".join(f"{d} {inst.get(d) or 'absent'}" for d in STACK) + ")")
    if stack.get("mismatch"):
        return head + "; MISMATCHED STACK: " + "; ".join(stack["mismatch"])
    return head + "; stack matches its metadata"


def collect(device: str = "cpu") -> dict[str, Any]:
    """{"versions": {...}, "hardware": {...}, "stack": :func:`fa4_stack`} for the report."""
    versions: dict[str, Any] = {name: dist_version(dist) for dist, name in DISTRIBUTIONS.items()}
    versions["python"] = platform.python_version()
    # an explicit FA4VERIFY_GIT_COMMIT wins: a copied checkout (a GPU machine's) may carry stale
    # git metadata, and a wheel install has none
    commit = os.environ.get("FA4VERIFY_GIT_COMMIT", "").strip() or _git_commit()
    if commit:
        versions["fa4verify_git"] = commit
    hardware: dict[str, Any] = {
        "machine": platform.machine(), "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "hostname": platform.node(),
        "device": device, "executable": sys.executable,
    }
    if device == "cuda":
        hardware.update(_gpu_info())
    return {"versions": versions, "hardware": hardware, "stack": fa4_stack()}
