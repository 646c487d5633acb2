"""One GPU per pytest-xdist worker, and fuzz campaigns split by seed ranges over the workers.

The engine is pytest-xdist (``-n N``): it starts the workers and distributes the items; this
module only decides which GPU a worker sees and which seeds it draws.

    pytest --fa4verify -n 8 -p fa4verify --fa4-only          # a node of 8 GPUs: worker gwI sees GPU I

* :func:`pin_worker_gpu` -- called by the pytest plugin at ``pytest_configure`` of every xdist
  worker, before anything imports torch's CUDA state: maps ``PYTEST_XDIST_WORKER=gw<i>`` to
  ``CUDA_VISIBLE_DEVICES=<device i mod n>``, where the devices are the parent's
  ``CUDA_VISIBLE_DEVICES`` list (or ``0..FA4VERIFY_NGPUS-1``, or ``0``). ``FA4VERIFY_PIN_GPU=0``
  turns it off. Refuses (RuntimeError) if CUDA is already initialised in this process.
* :func:`seed_range` / :func:`shard` -- worker ``i`` of ``n`` takes seeds ``base+i, base+i+n, ...``
  (every seed exactly once over the workers); :func:`merge` joins per-worker results (a dict
  ``seed -> status``) and refuses duplicates or gaps, and :func:`merged_status` is the judge's
  fail > undecided > pass over them.
* :func:`assign_groups` -- the audit's check shards (``@check(shards=)``): cases with the same key
  (an FA4 compile key) on one shard, the groups spread heaviest first over the least loaded shard.

Nothing here imports torch.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Iterable, Mapping, MutableMapping, Optional, Sequence

__all__ = ["ENV_WORKER", "ENV_PIN", "ENV_NGPUS", "worker_index", "worker_count", "visible_devices",
           "pin_worker_gpu", "positive_int_env", "seed_range", "shard", "merge", "merged_status", "assign_groups"]

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


def seed_range(base: int, count: int, index: int, workers: int) -> list[int]:
    """Seeds of worker ``index`` of ``workers`` from ``base .. base+count-1`` (strided)."""
    if workers < 1 or not 0 <= index < workers:
        raise ValueError(f"worker {index} of {workers}: expected 0 <= index < workers")
    if count < 0:
        raise ValueError(f"count {count}: expected >= 0")
    return list(range(base + index, base + count, workers))


def shard(items: Sequence, index: int, workers: int) -> list:
    """Items ``index, index+workers, ...`` (the same striding as :func:`seed_range`)."""
    if workers < 1 or not 0 <= index < workers:
        raise ValueError(f"worker {index} of {workers}: expected 0 <= index < workers")
    return list(items[index::workers])


def merge(parts: Iterable[Mapping], expected: Optional[Iterable] = None) -> dict:
    """Union of per-worker ``{case: result}``; ValueError on a case run twice or (with
    ``expected``) a case missing or unexpected."""
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            if k in out:
                raise ValueError(f"case {k!r} ran on two workers")
            out[k] = v
    if expected is not None:
        exp = set(expected)
        missing, extra = exp - set(out), set(out) - exp
        if missing or extra:
            raise ValueError(f"sharded run incomplete: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    return out


def merged_status(statuses: Iterable[str]) -> str:
    """fail > undecided > pass over merged results (none: undecided), as the judge."""
    from fa4verify.judge.verdict import worst_status
    return worst_status(statuses)


def assign_groups(items: Sequence, shards: int, *, key=None, cost=None, key_cost: float = 0.0
                  ) -> list[list[int]]:
    """Indices of ``items`` per shard (``shards`` lists, each in increasing order): a partition.

    Items with equal ``key(item)`` form one group that stays on one shard (``key=None``: every
    item its own group). A group weighs ``key_cost`` (e.g. one kernel compile) plus the sum of
    ``cost(item)`` (default 1 each); groups are taken heaviest first (ties: first appearance) and
    each goes to the least loaded shard (ties: the lowest index) -- the LPT rule, deterministic,
    within 4/3 of the best makespan. ``shards`` larger than the number of groups leaves shards
    empty.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards {shards!r}: expected an int >= 1")
    groups: dict = {}
    for j, it in enumerate(items):
        g = groups.setdefault(("k", key(it)) if key is not None else ("i", j), [])
        g.append(j)
    weight = {g: (key_cost if key is not None else 0.0)
              + sum(float(cost(items[j])) if cost is not None else 1.0 for j in idx)
              for g, idx in groups.items()}
    order = sorted(groups, key=lambda g: (-weight[g], groups[g][0]))
    load = [0.0] * shards
    out: list[list[int]] = [[] for _ in range(shards)]
    for g in order:
        s = min(range(shards), key=lambda i: (load[i], i))
        load[s] += weight[g]
        out[s].extend(groups[g])
    return [sorted(o) for o in out]
