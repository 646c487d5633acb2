"""Exhaustive device sweep of FA4's own exp2 device functions (``fa4verify exp2 --device cuda``).

For every fp32 input of a range (all 2.2e9 of [-127, 8] by default) and of the edge domain, the
inputs are generated on the device from their ordered-integer index (no host transfer), FA4's own
device function is evaluated by its probe kernel (``kernels/probes/``), and the result is compared
bit for bit, on the device, with the device twin (``kernels/twin_torch.py``, itself bit-exact to
the CPU twin: Note [Device twin of the exp2 emulation]). Only counts, maxima and the first few
mismatching inputs come back to the host.

Note [What the device sweep certifies]
--------------------------------------
The CPU certification (``fa4verify.exp2.cert``, exhaustive) scores the *twin* against the
correctly rounded ``2^x`` (relative error, fp32 / bf16 / fp16 ulps, wrong-rounding counts,
monotonicity). When the device function equals the twin bit for bit on every input of the range,
the device function has exactly the twin's results, so every figure of the CPU certification is a
figure of the device function ("measured on <GPU>" for the equality, "CPU twin" for the scores).
One mismatch voids that transfer: it is a violation and the report lists the first inputs.
As an independent cross-check the sweep also scores the device results itself against the
correctly rounded fp32 ``2^x`` (the float64 filter of ``oracles/exp2.py`` on the device, its
undecided inputs settled on the host by ``exp2_cr``): ``max_ulp_fp32`` must equal the CPU figure.
MUFU ``ex2.approx.ftz`` has no twin (the hardware table is not modelled); it is scored the same
way (max fp32 ulp from the correctly rounded value on [-126, 0] and [0, 8]).

Edge domain (emulation): every fp32 in [-FLT_MAX, -127) (clamped to -127: result +0), every fp32
in (hi, 2^22) (above 128 the exponent field wraps: garbage, modelled by the twin), ``-inf`` and
NaNs (quiet and signalling, both signs; ``max.f32`` turns them into -127). ``+inf`` and
``x >= 2^22`` lie outside the device twin's domain and are not swept.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from fa4verify.oracles import binary32 as b32

__all__ = ["CHUNK", "EDGE_NAN_BITS", "emulation_ranges", "sweep_emulation", "sweep_mufu",
           "device_functions", "run_device", "cr_f32_torch", "DeviceSweep"]

#: Inputs per device step (2^26 fp32 = 256 MiB; the float64 temporaries of the twin ~4 GiB).
CHUNK = 1 << 26
#: NaN bit patterns of the edge domain (quiet, signalling, both signs, extreme payloads).
EDGE_NAN_BITS = (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
                 0x7FA5A5A5)
FLT_MAX = float(np.finfo(np.float32).max)
#: mismatching inputs kept for the report
EXAMPLES = 5


@dataclass
class DeviceSweep:
    """Result of sweeping one device function over ordered-integer ranges."""
    function: str
    degree: Optional[int]
    twin_variant: Optional[str]
    n_inputs: int = 0
    mismatches: Optional[int] = 0
    examples: list = field(default_factory=list)     # {"x", "x_bits", "device_bits", "twin_bits"}
    seconds: float = 0.0
    compile_seconds: float = 0.0
    ranges: list = field(default_factory=list)
    scored: dict = field(default_factory=dict)       # name -> {"n", "max_ulp_fp32", "argmax", ...}
    oracle_fallbacks: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


# ============================================================================ inputs
def _ord(v: float) -> int:
    return int(b32.ordered(np.float32(v)))


def _f32_from_ordered_torch(o):
    """float32 tensor of the fp32 values with ordered ints ``o`` (int64 tensor)."""
    import torch
    b = torch.where(o < 0, (-o) | 0x80000000, o)
    b = torch.where(b >= 2**31, b - 2**32, b)
    return b.to(torch.int32).view(torch.float32)


def _chunks(spans: Sequence[tuple[int, int]], chunk: int, device):
    import torch
    for a, b in spans:
        o = a
        while o <= b:
            e = min(b, o + chunk - 1)
            yield _f32_from_ordered_torch(torch.arange(o, e + 1, dtype=torch.int64, device=device))
            o = e + 1


def _subtract(span: tuple[int, int], cut: tuple[int, int]) -> list[tuple[int, int]]:
    a, b = span
    out = []
    if cut[0] > a:
        out.append((a, min(b, cut[0] - 1)))
    if cut[1] < b:
        out.append((max(a, cut[1] + 1), b))
    return [(x, y) for x, y in out if x <= y]


def emulation_ranges(lo: float, hi: float) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Ordered-int spans of the main range [lo, hi] and of the edge domain (see module Note)."""
    from fa4verify.kernels.twin_torch import DOMAIN_HI
    olo, ohi = b32.f32_range(lo, hi)
    main = [(olo, ohi)] if olo <= ohi else []
    top = _ord(DOMAIN_HI) - 1
    edge = [(_ord(-FLT_MAX), _ord(-127.0) - 1), (_ord(8.0) + 1, top)]
    if main:
        edge = [p for s in edge for p in _subtract(s, main[0])]
    main = [(a, min(b, top)) for a, b in main if a <= top]
    return main, edge


# ============================================================================ oracle on the device
def cr_f32_torch(x):
    """Correctly rounded fp32 ``2^x`` of a float32 tensor with finite x in [-126, 128): the float64
    filter of ``oracles.exp2`` (``FILTER_REL_BOUND``) on x's device, undecided inputs by
    ``exp2_cr`` on the host. Returns ``(cr, n_fallbacks)``.

    Accuracy: exact, assuming torch's float64 ``exp2`` on that device is within 2^-50 relative
    (CUDA documents 1 ulp = 2^-52 for ``exp2``; glibc likewise on the CPU)."""
    import torch
    from fa4verify.oracles.exp2 import FILTER_REL_BOUND, exp2_cr
    y = torch.exp2(x.to(torch.float64))
    lo = (y * (1 - FILTER_REL_BOUND)).to(torch.float32)
    hi = (y * (1 + FILTER_REL_BOUND)).to(torch.float32)
    und = torch.nonzero(lo != hi).reshape(-1)
    if und.numel():
        xs = x[und].cpu().numpy()
        lo[und] = torch.from_numpy(exp2_cr(xs, "f32")).to(lo.device)
    return lo, int(und.numel())


def _score_chunk(x, y, acc: dict, name: str) -> int:
    """Max fp32 ulp distance of non-negative results ``y`` from RN32(2^x) over one chunk."""
    import torch
    cr, fb = cr_f32_torch(x)
    d = (y.view(torch.int32).to(torch.int64) - cr.view(torch.int32).to(torch.int64)).abs()
    if bool((y < 0).any()) or bool(torch.isnan(y).any()):
        d = torch.where((y < 0) | torch.isnan(y), torch.full_like(d, 2**40), d)
    i = int(torch.argmax(d))
    m = int(d[i])
    s = acc.setdefault(name, {"n": 0, "max_ulp_fp32": -1, "argmax": None, "exact": 0})
    s["n"] += int(x.numel())
    s["exact"] += int((d == 0).sum())
    if m > s["max_ulp_fp32"]:
        s["max_ulp_fp32"], s["argmax"] = m, float(x[i])
    return fb


# ============================================================================ sweeps
def sweep_emulation(fn: Callable, degree: int, variant: str, spans: Sequence[tuple[int, int]], *,
                    edge: Sequence[tuple[int, int]] = (), chunk: int = CHUNK, device="cuda",
                    function: str = "ex2_emulation", score: bool = True) -> DeviceSweep:
    """Compare ``fn(x)`` (FA4's device function, float32 tensor in and out) with the device twin
    bit for bit on every input of ``spans`` and ``edge`` (and the edge NaNs / -inf); score the
    main-domain part of ``spans`` (x in [-126, 128)) against the correctly rounded fp32 2^x."""
    import torch
    from fa4verify.kernels.twin_torch import ex2_emulation_torch
    r = DeviceSweep(function, degree, variant, ranges=[list(s) for s in spans] + [list(s) for s in edge])
    main_lo, main_hi = _ord(-126.0), _ord(128.0) - 1
    t0 = time.perf_counter()

    def compare(x):
        y = fn(x)
        t = ex2_emulation_torch(x, degree, variant, check_domain=False)
        bad = y.view(torch.int32) != t.view(torch.int32)
        k = int(bad.sum())
        r.n_inputs += int(x.numel())
        if k:
            r.mismatches += k
            if len(r.examples) < EXAMPLES:
                idx = torch.nonzero(bad).reshape(-1)[:EXAMPLES - len(r.examples)]
                for i in idx.tolist():
                    xb = int(x[i:i + 1].view(torch.int32)) & 0xFFFFFFFF
                    r.examples.append({"x": float(x[i]), "x_bits": f"0x{xb:08x}",
                                       "device_bits": f"0x{int(y[i:i + 1].view(torch.int32)) & 0xFFFFFFFF:08x}",
                                       "twin_bits": f"0x{int(t[i:i + 1].view(torch.int32)) & 0xFFFFFFFF:08x}"})
        return y

    for x in _chunks(spans, chunk, device):
        y = compare(x)
        if score:
            m = (x >= -126.0) & (x < 128.0)
            if bool(m.all()):
                r.oracle_fallbacks += _score_chunk(x, y, r.scored, "main")
            elif bool(m.any()):
                r.oracle_fallbacks += _score_chunk(x[m], y[m], r.scored, "main")
    for x in _chunks(edge, chunk, device):
        compare(x)
    specials = torch.tensor(np.array(EDGE_NAN_BITS, dtype=np.uint32).view(np.int32), device=device)
    compare(torch.cat([specials.view(torch.float32),
                       torch.tensor([-np.inf], dtype=torch.float32, device=device)]))
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    r.seconds = time.perf_counter() - t0
    return r


def sweep_mufu(fn: Callable, lo: float, hi: float, *, chunk: int = CHUNK, device="cuda") -> DeviceSweep:
    """Score ``fn`` (MUFU ``ex2.approx.ftz``) against the correctly rounded fp32 2^x on every input
    of [max(lo, -126), min(hi, 8)], split at 0 (no twin: no bit comparison)."""
    import torch
    r = DeviceSweep("mufu_ex2", None, None)
    t0 = time.perf_counter()
    for name, a, b in (("neg", max(lo, -126.0), min(hi, 0.0)), ("pos", max(lo, 0.0), min(hi, 8.0))):
        if a > b:
            continue
        olo, ohi = b32.f32_range(a, b)
        r.ranges.append([olo, ohi])
        for x in _chunks([(olo, ohi)], chunk, device):
            y = fn(x)
            r.n_inputs += int(x.numel())
            r.oracle_fallbacks += _score_chunk(x, y, r.scored, name)
    r.mismatches = None                    # no twin: nothing compared bit for bit
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    r.seconds = time.perf_counter() - t0
    return r


# ============================================================================ the GPU's functions
def device_functions(arch: str) -> list[tuple[str, str, str]]:
    """``(function, probe key, twin variant)`` of the emulation functions FA4 has for ``arch``:
    the scalar ``ex2_emulation`` everywhere; the packed ``ex2_emulation_2`` (what the SM100
    kernels run, ``.f32x2`` instructions) on sm100 / sm103 only."""
    out = [("ex2_emulation", "ex2_emulation", "scalar")]
    if arch in ("sm100", "sm103"):
        out.append(("ex2_emulation_2", "ex2_emulation_packed", "packed"))
    return out


def _probe_fn(key: str, variant: str | None):
    """The probe's ``run`` on inputs padded (with zeros) to a multiple of its chunk, so that one
    compile per variant serves every chunk, edge span and the few special inputs."""
    import torch
    from fa4verify.kernels.probes import probe_base as pb
    m = pb.load(key)
    step = pb.DEFAULT_CHUNK

    def fn(x):
        n = int(x.numel())
        if n % step:
            x = torch.cat([x, torch.zeros(step - n % step, dtype=x.dtype, device=x.device)])
        y = m.run(x) if variant is None else m.run(x, variant)
        return y[:n]
    return fn


def _warm(fn, device) -> float:
    """Compile (first call) on one probe-sized chunk; returns the seconds it took."""
    import torch
    from fa4verify.kernels.probes.probe_base import DEFAULT_CHUNK
    t0 = time.perf_counter()
    fn(torch.zeros(DEFAULT_CHUNK, dtype=torch.float32, device=device))
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_device(degrees: Sequence[int], lo: float, hi: float, *, gpu, chunk: int = CHUNK,
               mufu: bool = True, fns: dict | None = None, device: str = "cuda",
               where: str | None = None, edge_spans: Sequence[tuple[int, int]] | None = None) -> dict:
    """The ``device`` section of the ``fa4verify exp2 --device cuda`` report.

    ``gpu`` is ``kernels.device.local_gpu()``; ``fns`` (tests) maps ``(function, degree)`` (and
    ``("mufu_ex2", None)``) to a stand-in device function, with ``device="cpu"``; ``edge_spans``
    (tests) replaces the edge domain's ordered-int spans."""
    from fa4verify.kernels.device import where_measured
    where = where or where_measured(gpu)
    main, edge = emulation_ranges(lo, hi)
    if edge_spans is not None:
        edge = [tuple(e) for e in edge_spans]
    sec: dict = {"where": where, "gpu": gpu.name if gpu else None, "sm": gpu.sm if gpu else None,
                 "arch": gpu.arch if gpu else None, "chunk": chunk,
                 "main_spans_ordered": [list(s) for s in main], "edge_spans_ordered": [list(s) for s in edge],
                 "edge_nan_bits": [f"0x{b:08x}" for b in EDGE_NAN_BITS],
                 "certifies": "device == twin bit for bit on every input => the CPU twin certification of "
                              "the same degree applies to the device function (Note [What the device sweep "
                              "certifies], fa4verify/exp2/device.py)",
                 "sweeps": [], "violations": []}
    arch = gpu.arch if gpu else "sm90"
    for func, key, variant in device_functions(arch):
        for d in degrees:
            fn = (fns or {}).get((func, d)) or _probe_fn(key, str(d))
            comp = 0.0 if fns else _warm(fn, device)
            r = sweep_emulation(fn, d, variant, main, edge=edge, chunk=chunk, device=device, function=func)
            r.compile_seconds = round(comp, 2)
            r.seconds = round(r.seconds, 3)
            row = r.as_dict()
            if variant == "scalar":
                row["note"] = ("the CPU certification models the packed ex2_emulation_2; the scalar function "
                               "differs from it only on negative subnormal x (add.rm.ftz), where it returns "
                               "1.0 = RN(2^x) -- the certified figures hold for it too")
            sec["sweeps"].append(row)
            if r.mismatches:
                ex = ", ".join(f"x={e['x']!r} device {e['device_bits']} twin {e['twin_bits']}" for e in r.examples[:3])
                sec["violations"].append(f"{func} degree {d}: device != twin on {r.mismatches:,} of "
                                         f"{r.n_inputs:,} inputs ({ex})")
    if mufu:
        fn = (fns or {}).get(("mufu_ex2", None)) or _probe_fn("mufu_ex2", None)
        comp = 0.0 if fns else _warm(fn, device)
        r = sweep_mufu(fn, lo, hi, chunk=chunk, device=device)
        r.compile_seconds = round(comp, 2)
        r.seconds = round(r.seconds, 3)
        sec["mufu"] = r.as_dict()
    return sec


def cross_check(section: dict, cpu_degrees: dict) -> list[str]:
    """Device-scored ``max_ulp_fp32`` of each emulation sweep vs the CPU certification's figure of
    the same degree (equal when device == twin and both oracles are right); returns violations.
    Only the scalar/packed difference on negative subnormals (x > -2^-126, outside the scored
    figure's argmax in practice) could separate them, so a difference is reported, never hidden."""
    out = []
    for s in section.get("sweeps", []):
        cpu = cpu_degrees.get(str(s["degree"]))
        dev = (s.get("scored") or {}).get("main")
        if not cpu or not dev or not cpu.get("n_inputs"):
            continue
        s["cpu_max_ulp_fp32"] = cpu.get("max_ulp_fp32")
        if dev["max_ulp_fp32"] != cpu.get("max_ulp_fp32"):
            out.append(f"{s['function']} degree {s['degree']}: device-scored max_ulp_fp32 {dev['max_ulp_fp32']} "
                       f"!= CPU twin certification {cpu.get('max_ulp_fp32')}")
    return out
