"""The GPUs of a node and the pinning of a process to one (``--gpus``: the audit's pool, one
engine call per GPU for ``fa4verify determinism``; pytest-xdist workers). :func:`visible_gpus`
numbers them as the user does (``nvidia-smi``, through the parent's ``CUDA_VISIBLE_DEVICES``);
:func:`child_env` pins a child before anything in it touches CUDA.

CPU test mode: ``FA4VERIFY_FAKE_GPUS=N`` lists N fake GPUs without ``nvidia-smi`` (the callers run
their CPU backend); only then may ``FA4VERIFY_FAKE_GPU_FAULT=i[,j]`` (those GPUs compute with the
``d_from_fp32_o`` mutation) and ``FA4VERIFY_FAKE_GPU_CRASH=i[,j]`` (their processes abort after the
first unit of work) plant faults. Nothing here imports torch at module level.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence

from fa4verify.run.worker import cuda_initialised

__all__ = ["ENV_FAKE", "ENV_FAKE_FAULT", "ENV_FAKE_CRASH", "Gpu", "nvidia_smi", "query_gpus", "visible_gpus",
           "select_gpus", "child_env", "fake_set", "fake_mode", "read_json", "pin_worker_gpu", "positive_int_env"]

ENV_FAKE = "FA4VERIFY_FAKE_GPUS"
ENV_FAKE_FAULT = "FA4VERIFY_FAKE_GPU_FAULT"
ENV_FAKE_CRASH = "FA4VERIFY_FAKE_GPU_CRASH"
ENV_INDEX = "FA4VERIFY_GPU_INDEX"
ENV_PIN = "FA4VERIFY_PIN_GPU"          #: "0": a pytest-xdist run nested in a pinned process does not re-pin
ENV_PARENT = "FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"
ENV_NGPUS = "FA4VERIFY_NGPUS"


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as the user numbers it. ``visible``: the ``CUDA_VISIBLE_DEVICES`` value that pins a
    child to it (the UUID when known, else the physical index)."""
    index: int
    visible: str
    name: str = "unknown"
    uuid: str = "unknown"
    fake: bool = False

    def label(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.uuid})"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Gpu":
        return cls(index=int(d["index"]), visible=str(d["visible"]), name=str(d.get("name", "unknown")),
                   uuid=str(d.get("uuid", "unknown")), fake=bool(d.get("fake", False)))


def nvidia_smi(fields: str, *args: str, timeout_s: float = 20.0) -> list[list[str]]:
    """The rows of ``nvidia-smi --query-gpu=FIELDS`` (every GPU, whatever this process's
    ``CUDA_VISIBLE_DEVICES``; ``args``: e.g. ``-i N``); [] without nvidia-smi. Never touches CUDA."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader", *args],
                           capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.SubprocessError):
        return []
    return [[p.strip() for p in line.split(",")] for line in r.stdout.splitlines()] if r.returncode == 0 else []


def query_gpus() -> list[tuple[str, str, str]]:
    """``(physical index, name, uuid)`` of every GPU ``nvidia-smi`` lists."""
    rows = nvidia_smi("index,name,uuid")
    return [(p[0], ",".join(p[1:-1]), p[-1]) for p in rows if len(p) >= 3 and p[0].isdigit()]


def fake_mode(env: Mapping[str, str] = os.environ) -> bool:
    """True in the CPU test mode (``FA4VERIFY_FAKE_GPUS`` set; ValueError when malformed)."""
    return positive_int_env(ENV_FAKE, env) is not None


def fake_set(var: str, env: Mapping[str, str] = os.environ) -> set[int]:
    """The fake GPU indices named in ``var`` (``"1"`` or ``"0,2"``); empty outside the test mode."""
    if not fake_mode(env):
        return set()
    v = env.get(var, "").strip()
    try:
        return {int(t) for t in v.split(",") if t.strip()}
    except ValueError:
        raise ValueError(f"{var}={v!r}: expected comma-separated GPU indices") from None


def _torch_count() -> int:
    """torch's CUDA device count (NVML-based where it can be: no CUDA context), 0 without torch."""
    try:
        import torch
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch / broken CUDA: no GPUs
        return 0


def visible_gpus(env: Mapping[str, str] = os.environ,
                 query: Callable[[], Sequence[tuple[str, str, str]]] = query_gpus,
                 count: Callable[[], int] | None = _torch_count) -> list[Gpu]:
    """The GPUs this process may hand to children, numbered as CUDA numbers them here: the
    entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, in that order) when set, else every GPU
    ``nvidia-smi`` lists. ``CUDA_VISIBLE_DEVICES=""`` (or ``-1``) means none. An entry
    ``nvidia-smi`` does not know keeps its text as ``visible`` (name "unknown"); without
    ``nvidia-smi``, ``count()`` (torch's device count) gives indices without names."""
    n = positive_int_env(ENV_FAKE, env)
    if n is not None:
        return [Gpu(i, str(i), f"Fake GPU {i}", f"GPU-fake-{i:08d}", True) for i in range(n)]
    phys = list(query())
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        if not phys and count is not None:
            return [Gpu(i, str(i)) for i in range(count())]   # no nvidia-smi: indices only
        return [Gpu(i, uuid or idx, name, uuid) for i, (idx, name, uuid) in enumerate(phys)]
    out: list[Gpu] = []
    for tok in [t.strip() for t in cvd.split(",")]:
        if not tok or tok.startswith("-"):
            break            # CUDA stops at the first invalid entry
        hit = next((p for p in phys if tok == p[0] or (tok.startswith("GPU-") and p[2].startswith(tok))), None)
        out.append(Gpu(len(out), tok) if hit is None else Gpu(len(out), hit[2] or hit[0], hit[1], hit[2]))
    return out


def select_gpus(spec: str, gpus: Sequence[Gpu]) -> list[Gpu]:
    """``--gpus``: ``all`` | ``N`` (the first N) | ``I,J,...`` (those indices; one index ``I,``).
    ValueError with a one-line reason on bad input or when a GPU does not exist."""
    s = (spec or "").strip().lower()
    n = len(gpus)
    if n == 0:
        raise ValueError(f"--gpus {spec!r}: no GPU visible (nvidia-smi lists none, or "
                         f"CUDA_VISIBLE_DEVICES is empty); CPU test mode: {ENV_FAKE}=N")
    if s == "all":
        return list(gpus)
    if s.isdigit():
        k = int(s)
        if not 1 <= k <= n:
            raise ValueError(f"--gpus {spec!r}: asks for {k} GPU(s), {n} visible (for GPU index {k} "
                             f"alone write '{k},')")
        return list(gpus[:k])
    toks = [t.strip() for t in s.removesuffix(",").split(",")]
    if not all(t.isdigit() for t in toks):
        raise ValueError(f"--gpus {spec!r}: expected 'all', a count N, or indices 'I,J,...'")
    idx = [int(t) for t in toks]
    if len(set(idx)) != len(idx):
        raise ValueError(f"--gpus {spec!r}: a GPU is named twice")
    bad = [i for i in idx if i >= n]
    if bad:
        raise ValueError(f"--gpus {spec!r}: GPU {bad[0]} does not exist ({n} visible: 0..{n - 1})")
    return [gpus[i] for i in idx]


def child_env(gpu: Gpu, parent: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that pin a child process to ``gpu`` (set before it starts)."""
    d = {"CUDA_VISIBLE_DEVICES": gpu.visible, ENV_PIN: "0", ENV_INDEX: str(gpu.index)}
    if "CUDA_VISIBLE_DEVICES" in parent:
        d[ENV_PARENT] = parent["CUDA_VISIBLE_DEVICES"]
    return d


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when it is missing or torn (a child that died mid-write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def worker_index(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The pytest-xdist worker number (``gw3`` -> 3), None outside xdist; ValueError if malformed."""
    w = env.get("PYTEST_XDIST_WORKER")
    m = re.fullmatch(r"gw(\d+)", w or "")
    if w and not m:
        raise ValueError(f"PYTEST_XDIST_WORKER={w!r}: expected gw<number>")
    return int(m.group(1)) if m else None


def visible_devices(env: Mapping[str, str] = os.environ) -> list[str]:
    """An xdist worker's devices: ``CUDA_VISIBLE_DEVICES``, else ``0..FA4VERIFY_NGPUS-1``, else "0"."""
    cvd = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    if cvd:
        return cvd
    k = positive_int_env(ENV_NGPUS, env)
    return [str(i) for i in range(k)] if k else ["0"]


def positive_int_env(name: str, env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The positive integer in ``env[name]``; None when unset or empty, else ValueError."""
    v = env.get(name, "").strip()
    try:
        n = int(v) if v else None
    except ValueError:
        n = 0
    if n is not None and n < 1:
        raise ValueError(f"{name}={v!r}: expected a positive integer")
    return n


def pin_worker_gpu(env: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """Pin this xdist worker (``gw<i>``; the pytest plugin, before anything touches CUDA) to device
    i mod n of :func:`visible_devices`: that device, or None (not a worker, or ``ENV_PIN=0``).
    Idempotent (the list is kept in ``ENV_PARENT``); RuntimeError when CUDA is initialised."""
    if env.get(ENV_PIN, "1") == "0":
        return None
    i = worker_index(env)
    if i is None:
        return None
    parent = env.get(ENV_PARENT)
    cur = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if parent is not None and cur not in [d.strip() for d in parent.split(",")]:
        parent = None   # a stale record (inherited by a nested run): the current list wins
    devs = visible_devices({**env, "CUDA_VISIBLE_DEVICES": parent} if parent is not None else env)
    dev = devs[i % len(devs)]
    if env.get("CUDA_VISIBLE_DEVICES") == dev and parent is not None:
        return dev
    if cuda_initialised():
        raise RuntimeError("fa4verify: CUDA was initialised before the xdist worker was pinned to a GPU; "
                           "pinning must happen before torch touches CUDA")
    env[ENV_PARENT] = ",".join(devs)
    env["CUDA_VISIBLE_DEVICES"] = dev
    return dev
