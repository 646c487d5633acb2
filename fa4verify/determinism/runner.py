"""The in-process runner: one configuration run repeatedly (deterministic and default mode) on one
device into a JSON-able worker record, and the backward timing."""
from __future__ import annotations

import os
import time
from typing import Any, Iterable, Mapping

from fa4verify.determinism.backends import Backend, Grads
from fa4verify.determinism.bitwise import _FORMATS, _dtype_name, _torch, as_tensor, compare_bitwise, digest, nan_count
from fa4verify.determinism.configs import DeterminismConfig
from fa4verify.determinism.guard import GuardedBuffer
from fa4verify.determinism.inputs import make_inputs
from fa4verify.determinism.schema import TENSORS

def _first_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:400]


class _DistinctDigests:
    """Per tensor: digest -> [count, first run index]."""

    def __init__(self) -> None:
        self.by_tensor: dict[str, dict[str, list[int]]] = {}

    def add(self, name: str, dg: str, run: int) -> None:
        d = self.by_tensor.setdefault(name, {})
        if dg in d:
            d[dg][0] += 1
        else:
            d[dg] = [1, run]

    def to_json(self) -> dict:
        return {k: {dg: {"count": c, "first_run": r} for dg, (c, r) in v.items()}
                for k, v in self.by_tensor.items()}


def _grad_tensors(g: Grads) -> dict[str, Any]:
    d = {"dq": g.dq, "dk": g.dk, "dv": g.dv}
    if g.dsink is not None:
        d["dsink"] = g.dsink
    for k, v in (g.extra or {}).items():
        if k in d:
            raise ValueError(f"extra tensor {k!r} shadows a gradient")
        d[k] = v
    return d


def _tensor_names(recs: Iterable[Mapping[str, Any]], mode: str = "det") -> list[str]:
    names = {t for x in recs for t in x.get(mode, {}).get("digests", {})}
    return [t for t in TENSORS if t in names] + sorted(names - set(TENSORS))


def _clone(t):
    torch = _torch()
    if isinstance(t, torch.Tensor):
        return t.detach().clone()
    import numpy as np
    return np.array(t, copy=True)


def _select_device(device: str) -> None:
    """Make ``device`` current (FA4 launches on the current device's stream)."""
    if device.startswith("cuda"):
        _torch().cuda.set_device(device)


def run_config(backend: Backend, cfg: DeterminismConfig, device: str, *, runs: int,
               default_runs: int = 0, guard_bytes: int | None = None,
               deadline: float | None = None) -> dict:
    """Run one configuration ``runs`` times deterministically (and ``default_runs`` times in
    default mode) in this process on ``device``. Returns a JSON-able dict (the worker record):

    ``status`` (``ok`` | ``unsupported`` | ``error`` | ``not-run``), ``inputs_digest``,
    ``fwd_digests``, ``det`` = {``digests``: tensor -> digest -> {count, first_run},
    ``guard_violations``: [run, report...] (first 5), ``unwritten``: [...], ``runs``},
    ``default`` = {``runs``, ``digests``, ``vs_first``: tensor -> {runs_differing,
    max_differing_elements, max_ulp, numel}, ``vs_deterministic``: tensor -> BitDiff}.
    """
    rec: dict[str, Any] = {"config": cfg.key(), "name": cfg.name, "device": device,
                           "pid": os.getpid(), "status": "ok"}
    if deadline is not None and time.monotonic() > deadline:
        rec.update(status="not-run", reason="time budget exhausted before this configuration")
        return rec
    stage = "inputs"
    t0 = time.perf_counter()
    try:
        _torch()                 # torch must import (else this record's error)
        _select_device(device)
        p = make_inputs(cfg, device)
        rec["inputs_digest"] = p.digest()
        stage = "forward"
        out, lse = backend.forward(p)
        backend.synchronize(device)
        rec["fwd_digests"] = {"out": digest(out)}
        if lse is not None:
            rec["fwd_digests"]["lse"] = digest(lse)
        bufs: dict[str, GuardedBuffer] = {}
        if backend.writes_into_buffers:
            for n, ref in (("dq", p.q), ("dk", p.k), ("dv", p.v)):
                bufs[n] = GuardedBuffer(n, tuple(ref.shape), ref.dtype, device,
                                        guard_bytes=guard_bytes)

        def one(deterministic: bool):
            for b in bufs.values():
                b.arm()
            if bufs:
                backend.synchronize(device)
            g = backend.backward(p, out, lse, deterministic=deterministic,
                                 dq=bufs["dq"].view if bufs else None,
                                 dk=bufs["dk"].view if bufs else None,
                                 dv=bufs["dv"].view if bufs else None)
            backend.synchronize(device)
            return g

        for mode, n_runs in (("det", runs), ("default", default_runs)):
            if n_runs <= 0:
                continue
            stage = "deterministic backward" if mode == "det" else "default backward"
            dd = _DistinctDigests()
            guard_bad: list[dict] = []
            unwritten: list[dict] = []
            not_aliased: set[str] = set()
            first: dict[str, Any] = {}
            vs_first: dict[str, dict] = {}
            for r in range(n_runs):
                g = one(mode == "det")
                ts = _grad_tensors(g)
                for n, b in bufs.items():
                    if not b.aliases(ts[n]):
                        not_aliased.add(n)
                    rep = b.check()
                    if not rep.guard_ok and len(guard_bad) < 5:
                        guard_bad.append({"run": r, **rep.to_json()})
                    if rep.nan_interior and len(unwritten) < 5:
                        unwritten.append({"run": r, "tensor": n, "nan": rep.nan_interior})
                if not bufs:
                    for n, t in ts.items():
                        c = nan_count(t) if _dtype_name(as_tensor(t)) in _FORMATS else 0
                        if c and len(unwritten) < 5:
                            unwritten.append({"run": r, "tensor": n, "nan": c})
                for n, t in ts.items():
                    dd.add(n, digest(t), r)
                    if r == 0:
                        first[n] = _clone(t)
                    elif mode == "default":
                        bd = compare_bitwise(t, first[n])
                        s = vs_first.setdefault(n, {"runs_differing": 0,
                                                    "max_differing_elements": 0, "max_ulp": 0,
                                                    "numel": bd.numel})
                        if not bd.equal:
                            s["runs_differing"] += 1
                            s["max_differing_elements"] = max(s["max_differing_elements"],
                                                              bd.differing)
                            s["max_ulp"] = max(s["max_ulp"], bd.max_ulp)
                if mode == "det":
                    rec.setdefault("shapes", {n: [list(as_tensor(t).shape),
                                                  _dtype_name(as_tensor(t))]
                                              for n, t in ts.items()})
            m: dict[str, Any] = {"runs": n_runs, "digests": dd.to_json(),
                                 "guard_violations": guard_bad, "unwritten": unwritten,
                                 "buffers_not_used": sorted(not_aliased)}
            if mode == "det":
                det_first = first
            else:
                for n in first:
                    vs_first.setdefault(n, {"runs_differing": 0, "max_differing_elements": 0,
                                            "max_ulp": 0, "numel": int(as_tensor(first[n]).numel())})
                m["vs_first"] = vs_first
                if runs > 0:
                    m["vs_deterministic"] = {n: compare_bitwise(first[n], det_first[n]).to_json()
                                             for n in first if n in det_first}
            rec[mode] = m
            del first
    except Exception as ex:  # noqa: BLE001 - recorded, classified
        kind = backend.classify(ex)
        rec["status"] = kind
        rec["stage"] = stage
        if kind == "unsupported":
            what = "deterministic mode " if stage == "deterministic backward" else ""
            rec["reason"] = f"{what}{backend.unsupported_msg} ({stage}): {_first_line(ex)}"
        else:
            import traceback
            rec["reason"] = f"{stage}: {_first_line(ex)}"
            rec["traceback"] = traceback.format_exc()[-3000:]
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def time_backward(backend: Backend, cfg: DeterminismConfig, device: str, *, reps: int = 20,
                  warmup: int = 3) -> dict:
    """Median backward time (ms) with ``deterministic`` True and False, same inputs, output
    buffers allocated once. CUDA events on a GPU backend, ``perf_counter`` otherwise. The record
    gives ``ratio_det_over_default`` (>1: deterministic is slower) and
    ``det_speed_pct_of_default`` (100 * default_ms / det_ms, the paper's "x% of the speed")."""
    torch = _torch()
    rec: dict[str, Any] = {"config": cfg.key(), "name": cfg.name, "device": device,
                           "reps": reps, "warmup": warmup}
    try:
        _select_device(device)
        p = make_inputs(cfg, device)
        out, lse = backend.forward(p)
        dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
        cuda = device.startswith("cuda")
        for det in (False, True, False, True):  # interleave to spread clock drift
            key = "det_ms" if det else "default_ms"
            for _ in range(warmup):
                backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
            backend.synchronize(device)
            ts = []
            for _ in range(reps):
                if cuda:
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
                    e1.record()
                    e1.synchronize()
                    ts.append(e0.elapsed_time(e1))
                else:
                    t0 = time.perf_counter()
                    backend.backward(p, out, lse, deterministic=det, dq=dq, dk=dk, dv=dv)
                    ts.append((time.perf_counter() - t0) * 1e3)
            rec.setdefault(key + "_samples", []).extend(ts)
        for key in ("det_ms", "default_ms"):
            s = sorted(rec[key + "_samples"])
            rec[key] = s[len(s) // 2]
            del rec[key + "_samples"]
        rec["ratio_det_over_default"] = rec["det_ms"] / rec["default_ms"]
        rec["det_speed_pct_of_default"] = 100.0 * rec["default_ms"] / rec["det_ms"]
        c = cfg
        flops_fwd = 4.0 * c.batch * c.nheads * c.seqlen_q * c.seqlen_k * (c.head_dim + c.hdv) / 2
        if c.causal:
            flops_fwd /= 2
        rec["bwd_tflops_default"] = 2.5 * flops_fwd / (rec["default_ms"] * 1e-3) / 1e12
        rec["bwd_tflops_det"] = 2.5 * flops_fwd / (rec["det_ms"] * 1e-3) / 1e12
        rec["status"] = "ok"
    except Exception as ex:  # noqa: BLE001
        rec["status"] = backend.classify(ex)
        rec["reason"] = _first_line(ex)
    return rec
