"""One process per GPU of a node: which GPUs, how each process is pinned, and how the processes are
started and waited for. Used by ``fa4verify determinism --gpus`` (:mod:`fa4verify.determinism.multi`)
and ``fa4verify audit --gpus`` (:mod:`fa4verify.audit.gpus`).

Engine: ``torch.multiprocessing.start_processes(..., start_method="spawn")``
-----------------------------------------------------------------------------
Chosen over ``torchrun`` / ``torch.distributed`` (gloo or NCCL) because nothing here is a
collective: each process computes digests or check results (small JSON) that the parent compares,
and a dead GPU process must become an *error* naming that GPU, never a hang. With spawn

* every process starts fresh (no inherited CUDA context, no fork of a CUDA-initialised parent),
  so ``CUDA_VISIBLE_DEVICES`` set first thing in the child holds for that child's CUDA driver;
* a Python exception in a child is written by torch's ``_wrap`` to its error file (the
  traceback reaches the parent), a signal shows as a negative exit code, and a child dies with
  its parent (``PR_SET_PDEATHSIG``);
* the parent waits on each process separately (not ``ProcessContext.join``, which kills the
  survivors on the first failure), so the other GPUs' results are kept and the dead one is named.

A gloo/NCCL process group would add a rendezvous port and, on a dead rank, a collective that
blocks until its timeout; gathering through files written by each process needs neither.

Pinning
-------
:func:`visible_gpus` lists the GPUs this process may use, in the numbering the user sees
(``nvidia-smi`` index/name/UUID, mapped through the parent's ``CUDA_VISIBLE_DEVICES``, whose
entries may be indices or UUIDs). :func:`select_gpus` parses ``--gpus all|N|I,J,...``.
:func:`pin_process` sets ``CUDA_VISIBLE_DEVICES`` of the child to its one GPU (its UUID when
known, else the index) and refuses (``RuntimeError``) when CUDA is already initialised in the
process. :func:`child_env` is the mapping it applies (also ``FA4VERIFY_PIN_GPU=0``, so a
pytest-xdist run nested inside does not re-pin, and ``FA4VERIFY_GPU_INDEX``).

CPU test mode
-------------
``FA4VERIFY_FAKE_GPUS=N`` makes :func:`visible_gpus` return N fake GPUs ("Fake GPU i",
``GPU-fake-…``) without asking ``nvidia-smi``; the callers then run their CPU backend (twin) in
the N processes. Two faults can be planted for tests, only in that mode:
``FA4VERIFY_FAKE_GPU_FAULT=i[,j]`` (those fake GPUs compute differently: the determinism child
runs the twin with the ``d_from_fp32_o`` mutation, a reproducible but different result) and
``FA4VERIFY_FAKE_GPU_CRASH=i[,j]`` (those GPUs' processes abort after their first unit of work;
for the audit ``FA4VERIFY_FAKE_GPU_CRASH_AFTER=N`` sets how many work units finish first, default
1, 0 = abort before any: :func:`fake_crash_after`).

Nothing here imports torch at module level.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pickle
import signal
import subprocess
import time
from typing import Any, Callable, Mapping, MutableMapping, Sequence

__all__ = ["ENV_FAKE", "ENV_FAKE_FAULT", "ENV_FAKE_CRASH", "ENV_FAKE_CRASH_AFTER", "Gpu", "query_gpus",
           "visible_gpus",
           "select_gpus", "child_env", "pin_process", "Outcome", "run_per_gpu", "fake_set",
           "fake_mode", "fake_crash_after", "read_json", "GPUS_HELP"]

ENV_FAKE = "FA4VERIFY_FAKE_GPUS"
ENV_FAKE_FAULT = "FA4VERIFY_FAKE_GPU_FAULT"
ENV_FAKE_CRASH = "FA4VERIFY_FAKE_GPU_CRASH"
ENV_FAKE_CRASH_AFTER = "FA4VERIFY_FAKE_GPU_CRASH_AFTER"
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
    from fa4verify.sharding import positive_int_env
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


def fake_crash_after(env: Mapping[str, str] = os.environ) -> int:
    """How many work units a planted-crash audit process finishes before it aborts
    (``FA4VERIFY_FAKE_GPU_CRASH_AFTER``: an integer >= 0, default 1); ValueError when malformed."""
    v = env.get(ENV_FAKE_CRASH_AFTER, "").strip()
    if not v:
        return 1
    if not v.isdigit():
        raise ValueError(f"{ENV_FAKE_CRASH_AFTER}={v!r}: expected an integer >= 0")
    return int(v)


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
    """The variables :func:`pin_process` sets in the child pinned to ``gpu``."""
    prev = parent.get("CUDA_VISIBLE_DEVICES")
    d = {"CUDA_VISIBLE_DEVICES": gpu.visible, "FA4VERIFY_PIN_GPU": "0", ENV_INDEX: str(gpu.index)}
    if prev is not None:
        d["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] = prev
    return d


def _cuda_initialised() -> bool:
    from fa4verify.sharding import _cuda_initialised as f
    return f()


def pin_process(gpu: Gpu, env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Pin this process to ``gpu`` (see the module docstring); returns what it set. Refuses with
    RuntimeError when torch has initialised CUDA here (the driver has read its device list)."""
    if _cuda_initialised():
        raise RuntimeError(f"fa4verify: CUDA was initialised before this process was pinned to "
                           f"{gpu.label()}; pinning must happen before torch touches CUDA")
    upd = child_env(gpu, env)
    env.update(upd)
    return upd


@dataclasses.dataclass
class Outcome:
    """How one child process ended: ``exitcode`` (0 ok, > 0 exit status, < 0 killed by a signal,
    None still running when its time ran out and then killed), ``error``: a one-line reason when
    it did not end well (the child's exception, the signal, the timeout)."""
    rank: int
    gpu: Gpu
    exitcode: int | None
    error: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and self.error is None


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return f"signal {-rc}"


def _child_main(rank: int, target: str, payloads: list, gpus: list) -> None:
    """Body of child ``rank``: pin, then call ``target(payload)`` (a ``module:attr`` string)."""
    gpu = Gpu.from_json(gpus[rank])
    pin_process(gpu)
    mod, attr = target.split(":", 1)
    fn = getattr(importlib.import_module(mod), attr)
    fn(payloads[rank])


def run_per_gpu(target: str, payloads: Sequence[Any], gpus: Sequence[Gpu], *,
                timeout_s: float | None = None) -> list[Outcome]:
    """Start one spawned process per payload (child ``i`` pinned to ``gpus[i]``, which may repeat
    a GPU for several processes on it), all at once, and wait for each. ``target`` is
    ``"module:function"``, called as ``function(payload)`` in the child after pinning (a payload
    is anything picklable); it reports through files it writes (named in the payload). Never raises for a child's failure:
    it is in that child's :class:`Outcome`."""
    if len(payloads) != len(gpus):
        raise ValueError(f"{len(payloads)} payloads for {len(gpus)} GPU slots")
    import torch.multiprocessing as tmp

    t0 = time.monotonic()
    ctx = tmp.start_processes(_child_main, args=(target, list(payloads),
                                                 [g.to_json() for g in gpus]),
                              nprocs=len(payloads), join=False, start_method="spawn")
    deadline = None if not timeout_s else t0 + float(timeout_s)
    outs: list[Outcome] = []
    for i, proc in enumerate(ctx.processes):
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        proc.join(wait)
        err = None
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            err = f"timed out after {timeout_s:g} s (killed)"
            code = None
        else:
            code = proc.exitcode
        if err is None and code != 0:
            efile = ctx.error_files[i]
            tb = None
            if efile and os.path.exists(efile) and os.path.getsize(efile):
                try:
                    with open(efile, "rb") as f:
                        tb = pickle.load(f)
                except Exception:  # noqa: BLE001 - the exit code still says it failed
                    tb = None
            if tb:
                last = [ln for ln in str(tb).strip().splitlines() if ln.strip()]
                err = f"raised {last[-1].strip()[:300] if last else 'an exception'}"
            elif code < 0:
                err = f"killed by {_signal_name(code)} (exit {code})"
            else:
                err = f"exited with status {code}"
        efile = ctx.error_files[i]
        if efile and os.path.exists(efile):
            try:
                os.unlink(efile)
            except OSError:
                pass
        outs.append(Outcome(i, gpus[i], code, err, round(time.monotonic() - t0, 3)))
    return outs


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when it is missing or torn (a child that died mid-write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
