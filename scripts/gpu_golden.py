#!/usr/bin/env python3
"""Record golden vectors and MUFU error statistics on a CUDA GPU (run on the lent H200).

Writes into ``--out`` (default ``kernels/evidence/golden`` of the checkout, the package data
``fa4verify.kernels.evidence``):

* ``probe_outputs.npz/.json`` -- the stratified input sample (``golden.golden_inputs()``, ~1.0M
  fp32 inputs incl. NaN, +-inf, <= -127, (-127,-126), tiny negatives, subnormals, > 127, every
  binade) and the GPU output bits of every sm_90a probe on it: ``ex2_emulation`` degrees 1-5,
  MUFU ``exp2``, ``rcp.approx``, ``lg2.approx``, ``cvt.rn.bf16x2/f16x2`` and ``.to(bf16/f16)``.
* ``exparg_outputs.npz/.json`` -- the SM90 exponent argument ``S*c - m*c`` and ``exp2`` of it
  for (S, m) pairs at four fp32 scales c.
* ``mufu_stats.json`` -- exhaustive error statistics (every fp32 input of each range):
  ``ex2.approx.ftz`` on [-127, 0], [-126, 0] and [0, 8]; ``rcp.approx.ftz`` on [1, 2) and on all
  positive normals with normal reciprocals; ``lg2.approx.ftz`` (absolute error on [0.5, 2],
  ulp/relative elsewhere over all positive normals); and the emulation (degrees 3, 5) on
  [-126, 8]. Reference: float64 ``torch.exp2/log2/reciprocal`` on the GPU, itself checked against
  mpmath (120 bits) on a sample plus every argmax ("check the checker").

Every figure is "measured on <GPU name>". Usage::

    python3 scripts/gpu_golden.py [--out DIR] [--chunk-log2 26] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _x_from_bits(b64, torch):
    """int64 tensor of fp32 bit patterns (0..2^32-1) -> float32 tensor."""
    b = torch.where(b64 >= 2**31, b64 - 2**32, b64).to(torch.int32)
    return b.view(torch.float32)


def _f2b(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


def _ulp32(r, torch):
    """fp32 ulp of float64 values r (>= 2^-149; the subnormal spacing below 2^-126)."""
    _, e = torch.frexp(r.abs())
    return torch.ldexp(torch.ones_like(r), (e - 1).clamp(min=-126) - 23)


class Sweep:
    """Exhaustive error statistics of f(x) vs float64 ref(x) over a contiguous bit range."""

    def __init__(self, name: str, lo: float, hi: float, *, hi_inclusive: bool = True,
                 mode: str = "ulp"):
        self.name, self.lo, self.hi, self.mode = name, lo, hi, mode
        a, b = _f2b(lo), _f2b(hi)
        neg = (a >> 31) == 1 or (b >> 31) == 1
        if neg:  # negative range [lo, hi<=0]: bits from hi (|hi| small) up to lo
            self.b0, self.b1 = min(a, b), max(a, b)
        else:
            self.b0, self.b1 = a, b if hi_inclusive else b - 1
        self.count = 0
        self.max_err = -1.0
        self.argmax = None
        self.max_rel = -1.0
        self.argmax_rel = None
        self.sum_signed = 0.0
        self.hist = {"<=0.5": 0, "<=1": 0, "<=1.5": 0, "<=2": 0, "<=4": 0, ">4": 0}
        self.nonfinite = 0
        self.zeros = 0

    def run(self, fn, ref, torch, chunk: int, device: str = "cuda") -> "Sweep":
        for s in range(self.b0, self.b1 + 1, chunk):
            e_ = min(s + chunk, self.b1 + 1)
            x = _x_from_bits(torch.arange(s, e_, dtype=torch.int64, device=device), torch)
            y = fn(x).double()
            r = ref(x.double())
            err = (y - r)
            bad = ~torch.isfinite(y)
            self.nonfinite += int(bad.sum())
            self.zeros += int((y == 0).sum())
            if self.mode == "abs":
                u = err.abs()
                signed = err
            else:
                ulp = _ulp32(r, torch)
                u = err.abs() / ulp
                signed = err / ulp
            u = torch.where(bad, torch.full_like(u, float("inf")), u)
            i = int(torch.argmax(u))
            if float(u[i]) > self.max_err:
                self.max_err, self.argmax = float(u[i]), float(x[i])
            rel = (err.abs() / r.abs()).nan_to_num(nan=0.0, posinf=float("inf"))
            j = int(torch.argmax(rel))
            if float(rel[j]) > self.max_rel:
                self.max_rel, self.argmax_rel = float(rel[j]), float(x[j])
            self.sum_signed += float(signed[torch.isfinite(signed)].sum())
            self.count += int(x.numel())
            if self.mode != "abs":
                edges = [0.5, 1.0, 1.5, 2.0, 4.0]
                prev = torch.zeros((), dtype=torch.int64, device=device)
                for k, ed in zip(list(self.hist)[:-1], edges):
                    c = (u <= ed).sum()
                    self.hist[k] += int(c - prev)
                    prev = c
                self.hist[">4"] += int(u.numel() - prev)
        return self

    def to_dict(self) -> dict:
        d = {"range": [self.lo, self.hi], "inputs": self.count,
             "error_unit": "fp32 ulp of the exact value" if self.mode == "ulp" else "absolute",
             "max_err": self.max_err, "argmax_x": self.argmax,
             "max_rel_err": self.max_rel, "argmax_rel_x": self.argmax_rel,
             "mean_signed_err": self.sum_signed / max(1, self.count),
             "nonfinite_outputs": self.nonfinite, "zero_outputs": self.zeros}
        if self.mode == "ulp":
            d["histogram_ulp"] = dict(self.hist)
        return d


def check_reference(points: dict[str, np.ndarray], torch) -> dict:
    """float64 torch reference vs mpmath (120 bits) on the GPU-computed values."""
    import mpmath
    ctx = mpmath.mp.clone() if hasattr(mpmath.mp, "clone") else mpmath.mp
    ctx.prec = 120
    out = {}
    fns = {"exp2": (torch.exp2, lambda v: ctx.power(2, v)),
           "log2": (torch.log2, lambda v: ctx.log(v, 2)),
           "rcp": (torch.reciprocal, lambda v: 1 / v)}
    for name, xs in points.items():
        tfn, mfn = fns[name]
        xs = np.asarray(xs, dtype=np.float32)
        r = tfn(torch.from_numpy(xs.astype(np.float64)).cuda()).cpu().numpy()
        worst = 0.0
        for xv, rv in zip(xs.tolist(), r.tolist()):
            m = mfn(ctx.mpf(xv))
            if m == 0:
                continue
            rel = abs((ctx.mpf(rv) - m) / m)
            worst = max(worst, float(rel))
        out[name] = {"points": int(xs.size), "max_rel_diff_float64_vs_mpmath": worst,
                     "ok": worst < 2.0**-50}
    return out


def exact_ulp_at(name: str, x: float, y: float) -> float:
    """Error of GPU output y at input x in fp32 ulps of the exact value, via mpmath."""
    import mpmath
    mp = mpmath.mp
    mp.prec = 120
    xv = mp.mpf(float(np.float32(x)))
    ex = {"exp2": lambda: mp.power(2, xv), "rcp": lambda: 1 / xv, "log2": lambda: mp.log(xv, 2)}[name]()
    if ex == 0:
        return float("nan")
    e = int(mp.floor(mp.log(abs(ex), 2)))
    ulp = mp.ldexp(1, max(e, -126) - 23)
    return float(abs(mp.mpf(float(y)) - ex) / ulp)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "kernels" / "evidence" / "golden"))
    ap.add_argument("--chunk-log2", type=int, default=26)
    ap.add_argument("--quick", action="store_true", help="small ranges (smoke test)")
    args = ap.parse_args(argv)
    import torch
    from fa4verify.kernels import adapter, golden
    from fa4verify.kernels.probes import probe_base as pb
    ok, why = adapter.cuda_status()
    if not ok:
        print(f"no CUDA device: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    where = f"measured on {gpu}"
    cmd = "python3 scripts/gpu_golden.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t_all = time.time()

    emu = pb.load("ex2_emulation")
    mufu = pb.load("mufu_ex2")
    rcp = pb.load("rcp")
    lg2 = pb.load("log2")
    cvt = pb.load("cvt")
    exparg = pb.load("exparg")

    # ---------------------------------------------------------------- golden vectors
    t0 = time.time()
    xb = golden.golden_inputs()
    x = torch.from_numpy(xb.view(np.int32).copy()).cuda().view(torch.float32)
    arrays = {"x": xb}

    def bits32(t):
        return t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)

    for d in emu.VARIANTS:
        arrays[f"ex2_emulation_deg{d}"] = bits32(emu.run(x, d))
    arrays["mufu_ex2"] = bits32(mufu.run(x))
    arrays["rcp_approx"] = bits32(rcp.run(x))
    arrays["lg2_approx"] = bits32(lg2.run(x))
    for v in cvt.VARIANTS:
        arrays[v] = cvt.run(x, v).cpu().numpy().view(np.uint16)
    torch.cuda.synchronize()
    prov = golden.provenance(cmd, where=where, probes={
        "ex2_emulation_deg{1..5}": emu.MIRRORS, "mufu_ex2": mufu.MIRRORS,
        "rcp_approx": rcp.MIRRORS, "lg2_approx": lg2.MIRRORS, "cvt_*/to_*": cvt.MIRRORS},
        compiled_for="sm_90a (DSL target of the running GPU)",
        inputs="kernels/golden.py::golden_inputs() (sorted by value, NaNs last)")
    golden.save(out / "probe_outputs", arrays, prov, delta=tuple(arrays))
    print(f"probe_outputs: {xb.size} inputs, {len(arrays) - 1} probe outputs, "
          f"{(out / 'probe_outputs.npz').stat().st_size / 1e6:.2f} MB, {time.time() - t0:.1f} s")

    t0 = time.time()
    s_b, m_b = golden.exparg_inputs()
    s_t = torch.from_numpy(s_b.view(np.int32).copy()).cuda().view(torch.float32)
    m_t = torch.from_numpy(m_b.view(np.int32).copy()).cuda().view(torch.float32)
    ex_arrays = {"s": s_b, "m": m_b, "c": np.array([np.float32(c) for c in golden.EXPARG_SCALES],
                                                     dtype=np.float32).view(np.uint32)}
    for i, c in enumerate(golden.EXPARG_SCALES):
        a, p = exparg.run(s_t, m_t, c)
        ex_arrays[f"arg_c{i}"] = bits32(a)
        ex_arrays[f"p_c{i}"] = bits32(p)
    golden.save(out / "exparg_outputs", ex_arrays,
                golden.provenance(cmd, where=where, probe=exparg.MIRRORS,
                                  inputs="kernels/golden.py::exparg_inputs(); c = EXPARG_SCALES"))
    print(f"exparg_outputs: {s_b.size} pairs x {len(golden.EXPARG_SCALES)} scales, {time.time() - t0:.1f} s")

    # ---------------------------------------------------------------- exhaustive MUFU stats
    chunk = 1 << args.chunk_log2
    f_ex2 = lambda t: mufu.run(t)  # noqa: E731
    f_rcp = lambda t: rcp.run(t)  # noqa: E731
    f_lg2 = lambda t: lg2.run(t)  # noqa: E731
    q = args.quick
    sweeps = {
        "ex2.approx.ftz [-127,0]": (Sweep("ex2", -127.0 if not q else -1.0, -0.0), f_ex2, torch.exp2),
        "ex2.approx.ftz [-126,0]": (Sweep("ex2", -126.0 if not q else -1.0, -0.0), f_ex2, torch.exp2),
        "ex2.approx.ftz [0,8]": (Sweep("ex2", 0.0, 8.0 if not q else 2.0**-100), f_ex2, torch.exp2),
        "rcp.approx.ftz [1,2)": (Sweep("rcp", 1.0, 2.0, hi_inclusive=False), f_rcp, torch.reciprocal),
        "rcp.approx.ftz [2^-126,2^126]": (Sweep("rcp", 2.0**-126 if not q else 1.0, 2.0**126 if not q else 4.0),
                                         f_rcp, torch.reciprocal),
        "lg2.approx.ftz [0.5,2] (abs)": (Sweep("lg2", 0.5, 2.0, mode="abs"), f_lg2, torch.log2),
        "lg2.approx.ftz [2^-126,0.5)": (Sweep("lg2", 2.0**-126 if not q else 0.25, 0.5, hi_inclusive=False),
                                       f_lg2, torch.log2),
        "lg2.approx.ftz (2,2^128)": (Sweep("lg2", float(np.nextafter(np.float32(2), np.float32(3))),
                                          float(np.finfo(np.float32).max) if not q else 4.0),
                                    f_lg2, torch.log2),
        "ex2_emulation deg3 [-126,8]": (Sweep("exp2", -126.0 if not q else -1.0, 8.0 if not q else 1.0),
                                        lambda t: emu.run(t, "3"), torch.exp2),
        "ex2_emulation deg5 [-126,8]": (Sweep("exp2", -126.0 if not q else -1.0, 8.0 if not q else 1.0),
                                        lambda t: emu.run(t, "5"), torch.exp2),
    }
    stats = {}
    for label, (sw, fn, ref) in sweeps.items():
        t0 = time.time()
        if sw.lo < 0 < sw.hi:   # a range that crosses zero: negative half, then positive half
            neg = Sweep(sw.name, sw.lo, -0.0).run(fn, ref, torch, chunk)
            pos = Sweep(sw.name, 0.0, sw.hi).run(fn, ref, torch, chunk)
            d = _merge(neg, pos)
        else:
            d = sw.run(fn, ref, torch, chunk).to_dict()
        d["seconds"] = round(time.time() - t0, 2)
        stats[label] = d
        print(f"{label}: {d['inputs']} inputs, max err {d['max_err']:.4g} at x={d['argmax_x']!r}, "
              f"max rel {d['max_rel_err']:.4g}, {d['seconds']} s")
    # check the checker: float64 references vs mpmath on a sample + each argmax
    rng = np.random.default_rng(1)
    pts = {"exp2": np.concatenate([rng.uniform(-127, 8, 3000), [-127.0, -126.0, 0.0, 8.0]]),
           "rcp": np.exp2(rng.uniform(-126, 126, 3000)),
           "log2": np.exp2(rng.uniform(-126, 127, 3000))}
    for label, d in stats.items():
        key = "exp2" if ("ex2" in label) else ("rcp" if "rcp" in label else "log2")
        for k in ("argmax_x", "argmax_rel_x"):
            if d.get(k) is not None and math.isfinite(d[k]):
                pts[key] = np.append(pts[key], d[k])
    refcheck = check_reference(pts, torch)
    # exact (mpmath) error at each argmax, from a fresh GPU evaluation
    for label, d in stats.items():
        if d["error_unit"].startswith("fp32 ulp") and d.get("argmax_x") is not None:
            name = "exp2" if "ex2" in label else ("rcp" if "rcp" in label else "log2")
            fn = sweeps[label][1]
            xv = torch.tensor([d["argmax_x"]] * 512, dtype=torch.float32, device="cuda")
            yv = float(fn(xv)[0])
            d["argmax_output"] = yv
            d["max_err_mpmath_recheck"] = exact_ulp_at(name, d["argmax_x"], yv)
    doc = {"where": where, "provenance": golden.provenance(cmd, where=where),
           "reference": "float64 torch on the GPU (exp2, reciprocal, log2), validated vs mpmath",
           "reference_check": refcheck, "stats": stats,
           "notes": ["ulp = fp32 spacing of the exact value, 2^(max(floor(log2|v|),-126)-23)",
                     "ftz: outputs below 2^-126 are flushed by .ftz; [-127,-126) is kept separate"],
           "seconds_total": round(time.time() - t_all, 1)}
    (out / "mufu_stats.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"reference check: {json.dumps(refcheck)}")
    print(f"done in {time.time() - t_all:.1f} s -> {out}")
    return 0


def _merge(a: Sweep, b: Sweep) -> dict:
    da, db = a.to_dict(), b.to_dict()
    best = da if da["max_err"] >= db["max_err"] else db
    best_rel = da if da["max_rel_err"] >= db["max_rel_err"] else db
    n = da["inputs"] + db["inputs"]
    d = {"range": [da["range"][0], db["range"][1]], "inputs": n, "error_unit": da["error_unit"],
         "max_err": best["max_err"], "argmax_x": best["argmax_x"],
         "max_rel_err": best_rel["max_rel_err"], "argmax_rel_x": best_rel["argmax_rel_x"],
         "mean_signed_err": (da["mean_signed_err"] * da["inputs"] + db["mean_signed_err"] * db["inputs"]) / n,
         "nonfinite_outputs": da["nonfinite_outputs"] + db["nonfinite_outputs"],
         "zero_outputs": da["zero_outputs"] + db["zero_outputs"]}
    if "histogram_ulp" in da:
        d["histogram_ulp"] = {k: da["histogram_ulp"][k] + db["histogram_ulp"][k] for k in da["histogram_ulp"]}
    return d


if __name__ == "__main__":
    sys.exit(main())
