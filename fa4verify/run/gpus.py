"""The GPUs of a node: which GPUs, how a process is pinned to one, and (for ``fa4verify
determinism --gpus``, :mod:`fa4verify.determinism.multi`) one process per GPU started and waited
for. ``fa4verify audit --gpus`` gives the GPUs to the engine's pool, which pins one worker per GPU
(:mod:`fa4verify.run.pool`).

Processes: the engine's fresh workers (:func:`fa4verify.run.engine.run_calls`), each started with
:func:`child_env` of its GPU, so ``CUDA_VISIBLE_DEVICES`` holds before anything in it touches
CUDA; a process that dies or hangs is that GPU's error, the others' results are kept, and every
process dies with its parent.

Pinning
-------
:func:`visible_gpus` lists the GPUs this process may use, in the numbering the user sees
(``nvidia-smi`` index/name/UUID, mapped through the parent's ``CUDA_VISIBLE_DEVICES``, whose
entries may be indices or UUIDs). :func:`select_gpus` parses ``--gpus all|N|I,J,...``.
:func:`child_env` is the environment that pins a process to its one GPU (``CUDA_VISIBLE_DEVICES``:
its UUID when known, else the index (also ``FA4VERIFY_PIN_GPU=0``, so a
pytest-xdist run nested inside does not re-pin, and ``FA4VERIFY_GPU_INDEX``).

CPU test mode
-------------
``FA4VERIFY_FAKE_GPUS=N`` makes :func:`visible_gpus` return N fake GPUs ("Fake GPU i",
``GPU-fake-…``) without asking ``nvidia-smi``; the callers then run their CPU backend (twin) in
the N processes. Two faults can be planted for tests, only in that mode:
``FA4VERIFY_FAKE_GPU_FAULT=i[,j]`` (those fake GPUs compute differently: the determinism child
runs the twin with the ``d_from_fp32_o`` mutation, a reproducible but different result) and
``FA4VERIFY_FAKE_GPU_CRASH=i[,j]`` (those GPUs' processes abort after their first unit of work).

pytest-xdist
------------
:func:`pin_worker_gpu` -- called by the pytest plugin at ``pytest_configure`` of every xdist
worker, before anything imports torch's CUDA state: maps ``PYTEST_XDIST_WORKER=gw<i>`` to
``CUDA_VISIBLE_DEVICES=<device i mod n>``, where the devices are the parent's
``CUDA_VISIBLE_DEVICES`` list (or ``0..FA4VERIFY_NGPUS-1``, or ``0``). ``FA4VERIFY_PIN_GPU=0``
turns it off. Refuses (RuntimeError) if CUDA is already initialised in this process.

Nothing here imports torch at module level.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence

__all__ = ["ENV_FAKE", "ENV_FAKE_FAULT", "ENV_FAKE_CRASH", "Gpu", "query_gpus",
           "visible_gpus",
           "select_gpus", "child_env", "fake_set",
           "fake_mode", "read_json", "GPUS_HELP",
           "pin_worker_gpu", "positive_int_env", "ENV_PIN", "ENV_NGPUS"]

ENV_FAKE = "FA4VERIFY_FAKE_GPUS"
ENV_FAKE_FAULT = "FA4VERIFY_FAKE_GPU_FAULT"
ENV_FAKE_CRASH = "FA4VERIFY_FAKE_GPU_CRASH"
ENV_INDEX = "FA4VERIFY_GPU_INDEX"

#: the ``--gpus`` help text shared by the commands
GPUS_HELP = ("Run one process per GPU, pinned through CUDA_VISIBLE_DEVICES before CUDA starts "
             "(torch.multiprocessing spawn): 'all' = every visible GPU, N = the first N, "
             "'I,J,...' = those indices (one index: 'I,'). Indices are the parent's numbering "
             "(after its CUDA_VISIBLE_DEVICES). CPU test mode: FA4VERIFY_FAKE_GPUS=N.")


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


def query_gpus(timeout_s: float = 20.0) -> list[tuple[str, str, str]]:
    """``(physical index, name, uuid)`` of every GPU ``nvidia-smi`` lists (whatever this process's
    ``CUDA_VISIBLE_DEVICES``); [] without nvidia-smi. Does not touch CUDA."""
    try:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        r = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    out = []
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append((parts[0], ",".join(parts[1:-1]), parts[-1]))
    return out


def _fake_count(env: Mapping[str, str]) -> int | None:
    return positive_int_env(ENV_FAKE, env)


def fake_mode(env: Mapping[str, str] = os.environ) -> bool:
    """True in the CPU test mode (``FA4VERIFY_FAKE_GPUS`` set; ValueError when malformed)."""
    return _fake_count(env) is not None


def fake_set(var: str, env: Mapping[str, str] = os.environ) -> set[int]:
    """The fake GPU indices named in ``var`` (``"1"`` or ``"0,2"``); empty outside the test mode."""
    if _fake_count(env) is None:
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
    ``nvidia-smi`` does not know keeps its text as ``visible`` (name "unknown"). Without
    ``nvidia-smi``, ``count()`` (torch's device count) gives indices without names; each pinned
    child then records its GPU's name and UUID from torch."""
    n = _fake_count(env)
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
        if hit is None:
            out.append(Gpu(len(out), tok))
        else:
            out.append(Gpu(len(out), hit[2] or hit[0], hit[1], hit[2]))
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
    toks = [t.strip() for t in s.split(",")]
    if toks and toks[-1] == "":
        toks = toks[:-1]
    if not toks or not all(t.isdigit() for t in toks):
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
    prev = parent.get("CUDA_VISIBLE_DEVICES")
    d = {"CUDA_VISIBLE_DEVICES": gpu.visible, "FA4VERIFY_PIN_GPU": "0", ENV_INDEX: str(gpu.index)}
    if prev is not None:
        d["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] = prev
    return d


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when it is missing or torn (a child that died mid-write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


# ------------------------------------------------------------------------------ pytest-xdist
ENV_WORKER = "PYTEST_XDIST_WORKER"
ENV_COUNT = "PYTEST_XDIST_WORKER_COUNT"
ENV_PIN = "FA4VERIFY_PIN_GPU"
ENV_NGPUS = "FA4VERIFY_NGPUS"
_WORKER_RE = re.compile(r"^gw(\d+)$")


def worker_index(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The xdist worker number (``gw3`` -> 3), None outside xdist; ValueError if malformed."""
    w = env.get(ENV_WORKER)
    if w is None or w == "":
        return None
    m = _WORKER_RE.match(w)
    if not m:
        raise ValueError(f"{ENV_WORKER}={w!r}: expected gw<number>")
    return int(m.group(1))


def worker_count(env: Mapping[str, str] = os.environ) -> int:
    """xdist's worker count (1 outside xdist)."""
    try:
        return max(1, int(env.get(ENV_COUNT, "1")))
    except ValueError:
        raise ValueError(f"{ENV_COUNT}={env.get(ENV_COUNT)!r}: expected an integer") from None


def visible_devices(env: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs a worker may be pinned to: the parent's ``CUDA_VISIBLE_DEVICES`` entries, else
    ``0..FA4VERIFY_NGPUS-1``, else ``["0"]``."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip():
        return [d.strip() for d in cvd.split(",") if d.strip()]
    k = positive_int_env(ENV_NGPUS, env)
    if k is not None:
        return [str(i) for i in range(k)]
    return ["0"]


def positive_int_env(name: str, env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The positive integer in ``env[name]``, None when unset or empty; ValueError naming the
    variable otherwise."""
    v = env.get(name, "").strip()
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name}={v!r}: expected a positive integer")
    return n


def _cuda_initialised() -> bool:
    t = sys.modules.get("torch")
    if t is None:
        return False
    try:
        return bool(t.cuda.is_initialized())
    except Exception:   # pragma: no cover - torch without cuda module
        return False


def pin_worker_gpu(env: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """Pin this xdist worker to one GPU (see the module docstring); returns the device it
    pinned, or None (not a worker, or ``FA4VERIFY_PIN_GPU=0``). Idempotent: the original list
    is kept in ``FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES``."""
    if env.get(ENV_PIN, "1") == "0":
        return None
    i = worker_index(env)
    if i is None:
        return None
    parent = env.get("FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES")
    cur = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if parent is not None and cur not in [d.strip() for d in parent.split(",")]:
        parent = None   # a stale record (inherited by a nested run): the current list wins
    devs = visible_devices({**env, "CUDA_VISIBLE_DEVICES": parent} if parent is not None else env)
    dev = devs[i % len(devs)]
    if env.get("CUDA_VISIBLE_DEVICES") == dev and parent is not None:
        return dev
    if _cuda_initialised():
        raise RuntimeError("fa4verify: CUDA was initialised before the xdist worker was pinned to a GPU; "
                           "pinning must happen before torch touches CUDA")
    env["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] = ",".join(devs)
    env["CUDA_VISIBLE_DEVICES"] = dev
    return dev
