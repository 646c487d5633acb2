"""Worker of the production source mutants (``fa4verify.mutants.source``): runs FA4 -- the
private copy first on ``PYTHONPATH`` -- on one small causal problem, forward then backward with
the stage taps, and writes every tensor to ``<out>/tensors.npz`` plus ``<out>/meta.json``.
It judges nothing (the parent judges every mutant against one oracle).

``--device cpu`` is the pipeline's CPU stand-in (tests only): it checks that the patched copy
imports, then writes the float64 reference rounded to the kernel dtypes, with the mutant's fault
*simulated* in numpy for the graded families (``meta.json`` says ``"subject": "cpu-fake"``); it
never stands for a production measurement.

Run by the engine (:func:`run`, through :func:`fa4verify.run.engine.run_calls`), one fresh
process per private copy.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np


def problem_inputs(seed: int, batch: int, seqlen: int, nheads: int, head_dim: int):
    """q, k, v, dout: float32 arrays holding bf16 values (b, s, h, d), from ``seed``."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((batch, seqlen, nheads, head_dim)).astype(ml_dtypes.bfloat16)
                 .astype(np.float32) for _ in range(4))


def _check_private_copy() -> str:
    from fa4verify.kernels.adapter import interface_module   # the adapter: FA4's one importer
    f = str(Path(interface_module().__file__).resolve().parent / "__init__.py")
    want = os.environ.get("FA4VERIFY_PRIVATE_FA4")
    if want and not f.startswith(str(Path(want).resolve())):
        raise SystemExit(f"worker: flash_attn.cute came from {f}, not the private copy {want}")
    return f


def _det_reruns(shape, seed: int, runs: int) -> tuple[int, int]:
    """(mismatched elements, runs): the deterministic backward on its own problem of ``shape``
    (larger than the judged one: more CTAs than SMs, so an unordered dQ reduction shows), run
    ``runs + 1`` times, dQ/dK/dV compared bitwise with the first run."""
    import torch
    from fa4verify.kernels import adapter
    t = lambda x: torch.from_numpy(x).to("cuda", torch.bfloat16)   # noqa: E731
    Q, K, V, DO = (t(x) for x in problem_inputs(seed + 1, *shape))
    fwd = adapter.forward(Q, K, V, causal=True)
    first = adapter.backward(Q, K, V, fwd.out, DO, fwd.lse, causal=True, deterministic=True)
    mism = _rerun_mismatches(Q, K, V, fwd, DO, first, runs)
    torch.cuda.synchronize()
    return mism, runs


def _rerun_mismatches(Q, K, V, fwd, DO, first, runs: int) -> int:
    """Elements of dQ/dK/dV that differ bitwise from ``first`` over ``runs`` more deterministic
    backward calls on the same inputs."""
    import torch
    from fa4verify.kernels import adapter
    mism = 0
    for _ in range(runs):
        r2 = adapter.backward(Q, K, V, fwd.out, DO, fwd.lse, causal=True, deterministic=True)
        for a, b in ((first.dq, r2.dq), (first.dk, r2.dk), (first.dv, r2.dv)):
            mism += int((a.view(torch.int16) != b.view(torch.int16)).sum())
    return mism


def _run_cuda(q, k, v, do, *, det_runs: int, det_shape=None, seed: int = 15) -> dict:
    import torch
    from fa4verify.kernels import adapter
    from fa4verify.kernels.stage_taps import backward_with_taps
    t = lambda x: torch.from_numpy(x).to("cuda", torch.bfloat16)   # noqa: E731
    Q, K, V, DO = t(q), t(k), t(v), t(do)
    fwd = adapter.forward(Q, K, V, causal=True)
    res, taps = backward_with_taps(Q, K, V, fwd.out, DO, fwd.lse, causal=True, deterministic=True)
    torch.cuda.synchronize()
    acc = taps.dq_accum_logical(res.dq)
    f = lambda x: x.detach().float().cpu().numpy()                  # noqa: E731
    out = {"out": f(fwd.out), "lse": f(fwd.lse), "dq": f(res.dq), "dk": f(res.dk), "dv": f(res.dv),
           "dpsum": f(taps.dpsum), "lse_log2": f(taps.lse_log2),
           "dq_accum_zeroed": f(taps.dq_accum_zeroed), "dq_accum": f(acc)}
    # bitwise reruns of the deterministic backward (dQ, dK, dV)
    mism = _rerun_mismatches(Q, K, V, fwd, DO, res, det_runs)
    det_big = None
    if det_runs and det_shape is not None and tuple(det_shape) != tuple(q.shape):
        m2, _ = _det_reruns(det_shape, seed, det_runs)
        mism += m2
        det_big = {"shape": list(det_shape), "runs": det_runs + 1, "mismatched_elements": m2}
    meta = {"subject": "production", "gpu": torch.cuda.get_device_name(),
            "dq_scale": taps.dq_scale, "det_runs": det_runs, "det_mismatched_elements": mism,
            "det_large_problem": det_big,
            "config_fwd": fwd.config.to_dict(), "config_bwd": res.config.to_dict()}
    return out, meta


def _run_cpu_fake(q, k, v, do, mutant) -> tuple[dict, dict]:
    import ml_dtypes
    from fa4verify.judge import attention as ja
    p = ja.dense_problem(q, k, v, arch="sm90", dtype="bf16", causal=True)
    a = ja.arrays_from(q, k, v, do)
    of, ob = ja.oracle_forward(p, a), ja.oracle_backward(p, a)
    bf = lambda x: np.asarray(x, np.float64).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    f32 = lambda x: np.asarray(x, np.float64).astype(np.float32)   # noqa: E731
    fam, bias = (mutant.family, mutant.bias) if mutant is not None else (None, None)
    out = of.out * (1 + bias) if fam == "recip_bias" else of.out
    O = bf(out)
    D = (O.astype(np.float64) * do).sum(-1).transpose(0, 2, 1)
    if fam == "dpsum_bias":
        D = D * (1 + bias)
    scale = 1.0 / np.sqrt(q.shape[-1])
    lse = f32(of.lse)
    tensors = {"out": O, "lse": lse, "dq": bf(ob.dq), "dk": bf(ob.dk), "dv": bf(ob.dv),
               "dpsum": f32(D), "lse_log2": f32(np.where(np.isneginf(lse), 0.0, lse * np.log2(np.e))),
               "dq_accum_zeroed": np.zeros((q.shape[0], q.shape[2], q.shape[1] * q.shape[3]), np.float32),
               "dq_accum": f32(np.asarray(ob.dq) / scale)}
    return tensors, {"subject": "cpu-fake", "gpu": None, "dq_scale": float(scale), "det_runs": 0,
                     "det_mismatched_elements": 0}


def run(payload: dict) -> dict:
    """The worker's body (the engine's call target, in a fresh process with the private copy
    first on ``PYTHONPATH``): ``payload`` = ``out`` (directory), ``mutant`` (id or None),
    ``device`` (cuda | cpu), ``seed``, ``shape`` ("b,s,h,d"), ``det_runs`` (None: 8 for the
    control and determinism mutants), ``det_shape``. Writes the tensors and returns the meta."""
    from fa4verify.mutants.source import catalogue
    mid = payload.get("mutant")
    mutant = catalogue([mid])[0] if mid else None
    seed = int(payload.get("seed", 15))
    t0 = time.time()
    fc_file = _check_private_copy()
    b, s, h, d = (int(x) for x in str(payload.get("shape", "1,1024,2,128")).split(","))
    q, k, v, do = problem_inputs(seed, b, s, h, d)
    det = payload.get("det_runs")
    det = det if det is not None else (8 if (mutant is None or mutant.determinism) else 0)
    if payload.get("device", "cuda") == "cuda":
        ds = payload.get("det_shape", "4,2048,8,128")
        det_shape = tuple(int(x) for x in ds.split(",")) if ds else None
        tensors, meta = _run_cuda(q, k, v, do, det_runs=det, det_shape=det_shape, seed=seed)
    else:
        tensors, meta = _run_cpu_fake(q, k, v, do, mutant)
    outd = Path(payload["out"])
    outd.mkdir(parents=True, exist_ok=True)
    np.savez(outd / "tensors.npz", **tensors)
    meta.update({"mutant": mid, "flash_attn_cute": fc_file, "seed": seed,
                 "shape": [b, s, h, d], "causal": True, "wall_s": round(time.time() - t0, 2)})
    (outd / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    return meta
