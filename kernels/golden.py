"""Golden vectors: GPU output bits of the probe kernels, stored compactly with provenance.

File format (one ``<name>.npz`` plus ``<name>.json``):

* ``<name>.npz`` (``numpy.savez_compressed``): arrays of bit patterns. An array stored under
  ``<key>__d`` is **delta coded**: ``np.diff`` in wrapping ``uint32`` (or ``uint16``) arithmetic
  with an implicit leading 0, decoded by a wrapping ``cumsum``. The inputs are sorted by value
  (NaNs last), so inputs made of runs of consecutive fp32 patterns and the outputs of monotone
  functions delta-code to tiny integers and compress ~10x. Decoding is exact (tested).
* ``<name>.json``: provenance -- GPU name, driver, CUDA, torch, FA4, DSL versions, UTC date,
  the command that wrote it, the git commit, and the npz's sha256 and per-array shapes.

:func:`golden_inputs` is the deterministic generator of the stratified input sample (documented
there); the stored ``x`` array is the record, the generator only reproduces how it was built.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

__all__ = ["GoldenSet", "save", "load", "provenance", "golden_dir", "golden_inputs",
           "exparg_inputs", "delta_encode", "delta_decode", "sort_by_value"]


def golden_dir() -> Path:
    """The recorded golden vectors: ``golden/`` of the package data ``fa4verify.kernels.evidence``
    (source ``kernels/evidence/golden``; shipped in the wheel)."""
    from fa4verify.kernels.evidence import evidence_path
    return evidence_path("golden")


def delta_encode(a: np.ndarray) -> np.ndarray:
    """Wrapping first difference of an unsigned bit-pattern array (leading implicit 0)."""
    a = np.ascontiguousarray(a)
    if a.dtype not in (np.uint32, np.uint16):
        raise TypeError(f"delta coding needs uint32/uint16 bit patterns, got {a.dtype}")
    out = np.empty_like(a)
    if a.size:
        out[0] = a[0]
        np.subtract(a[1:], a[:-1], out=out[1:])          # wraps modulo 2^32 / 2^16
    return out


def delta_decode(d: np.ndarray) -> np.ndarray:
    """Inverse of :func:`delta_encode` (wrapping cumulative sum in the array's dtype)."""
    return np.cumsum(d, dtype=d.dtype)


def sort_by_value(x_bits: np.ndarray) -> np.ndarray:
    """Permutation that sorts fp32 bit patterns by value (``-0`` before ``+0``, NaNs last by
    bit pattern)."""
    x_bits = np.asarray(x_bits, dtype=np.uint32)
    # Monotone key: flip negatives to make an unsigned order (-inf < ... < -0 < +0 < ... < +inf).
    key = np.where(x_bits >> 31, ~x_bits, x_bits | np.uint32(0x80000000)).astype(np.uint64)
    x = x_bits.view(np.float32)
    key = np.where(np.isnan(x), np.uint64(1 << 33) + x_bits.astype(np.uint64), key)
    return np.argsort(key, kind="stable")


@dataclass
class GoldenSet:
    """A loaded golden file: ``arrays`` (decoded bit patterns) and ``provenance`` (dict)."""
    path: Path
    arrays: dict[str, np.ndarray]
    provenance: dict[str, Any]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def f32(self, key: str) -> np.ndarray:
        return self.arrays[key].view(np.float32)


def _git_commit() -> Optional[str]:
    """HEAD of the source checkout; ``FA4VERIFY_GIT_COMMIT`` when there is no git repository
    (the device machine runs a copy of the working tree)."""
    env = os.environ.get("FA4VERIFY_GIT_COMMIT")
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
    except Exception:
        out = ""
    if len(out) == 40 and all(c in "0123456789abcdef" for c in out):
        return out
    return env or None


def provenance(command: str, **extra: Any) -> dict[str, Any]:
    """Environment record for a golden file: versions from the adapter (GPU, driver, CUDA,
    torch, FA4, DSL), UTC date, ``command``, git commit, plus ``extra``."""
    try:
        from fa4verify.kernels.adapter import versions
        v = versions()
    except Exception as e:  # pragma: no cover - adapter import failure is itself recorded
        v = {"error": f"{type(e).__name__}: {e}"}
    d = {"versions": v, "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
         "command": command, "git_commit": _git_commit(), "host": os.uname().nodename}
    d.update(extra)
    return d


def save(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], prov: Mapping[str, Any],
         delta: tuple[str, ...] = ()) -> Path:
    """Write ``<path>.npz`` (compressed; keys in ``delta`` delta-coded) and ``<path>.json``.

    ``path`` may be given with or without ``.npz``. Returns the npz path.
    """
    p = Path(path)
    if p.suffix == ".npz":
        p = p.with_suffix("")
    p.parent.mkdir(parents=True, exist_ok=True)
    store: dict[str, np.ndarray] = {}
    shapes = {}
    for k, a in arrays.items():
        a = np.ascontiguousarray(a)
        shapes[k] = [list(a.shape), str(a.dtype)]
        store[f"{k}__d" if k in delta else k] = delta_encode(a) if k in delta else a
    npz = p.with_suffix(".npz")
    np.savez_compressed(npz, **store)
    meta = dict(prov)
    meta["file"] = npz.name
    meta["sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()
    meta["arrays"] = shapes
    meta["delta_coded"] = sorted(delta)
    p.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    return npz


def load(path: str | os.PathLike, verify: bool = True) -> GoldenSet:
    """Read a golden file written by :func:`save`; with ``verify`` the npz sha256 must equal the
    provenance record (raises ``ValueError`` otherwise)."""
    p = Path(path)
    if p.suffix != ".npz":
        p = p.with_suffix(".npz")
    meta_p = p.with_suffix(".json")
    meta = json.loads(meta_p.read_text()) if meta_p.exists() else {}
    if verify and meta.get("sha256"):
        h = hashlib.sha256(p.read_bytes()).hexdigest()
        if h != meta["sha256"]:
            raise ValueError(f"{p.name}: sha256 {h} != provenance {meta['sha256']}")
    arrays = {}
    with np.load(p) as z:
        for k in z.files:
            if k.endswith("__d"):
                arrays[k[:-3]] = delta_decode(z[k])
            else:
                arrays[k] = z[k]
    return GoldenSet(p, arrays, meta)


# ----------------------------------------------------------------------------------------------
# the stratified input sample
# ----------------------------------------------------------------------------------------------

def _f2b(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32).view(np.uint32)


def _windows(starts: np.ndarray, width: int) -> np.ndarray:
    starts = np.asarray(starts, dtype=np.int64)
    w = (starts[:, None] + np.arange(width, dtype=np.int64)[None, :]).reshape(-1)
    return (w & 0xFFFFFFFF).astype(np.uint32)


def golden_inputs(seed: int = 20261130, width: int = 256) -> np.ndarray:
    """The stratified fp32 input sample of the unary probes, as uint32 bit patterns, unique,
    sorted by value (NaNs last), even length. About 1.0M inputs:

    * edge list: NaNs (quiet/signalling, both signs), +-inf, +-0, +-FLT_MAX, +-min normal,
      +-min/max subnormal, -127, -126, 127, 128 and their neighbours, -2^-24..-2^-26, every
      integer and half-integer in [-130, 130];
    * every binade of both signs: a run of ``width`` consecutive patterns straddling the binade
      start (the end of the binade below and the start of this one): 2 x 256 runs;
    * [-127, 8] dense: 2048 runs starting at uniform values in [-127, 8], and 512 runs starting
      at uniform bit patterns of [-127, 0] and [0, 8] (exhaustive-style weighting);
    * (-127, -126) and tiny negatives (-2^-25, 0): 64 runs each;
    * 100k uniform bit patterns (all 2^32, so NaNs and huge values appear) and 100k uniform
      values in [-127, 8].
    """
    rng = np.random.default_rng(seed)
    edge_f = [np.inf, -np.inf, 0.0, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).max,
              2.0**-126, -2.0**-126, 2.0**-149, -2.0**-149, -127.0, -126.0, 127.0, 128.0,
              -2.0**-24, -2.0**-25, -2.0**-26, 8.0, -8.0, 1.0, -1.0]
    edge_f += [float(i) for i in range(-130, 131)] + [i + 0.5 for i in range(-130, 130)]
    edge = _f2b(edge_f)
    edge = np.concatenate([edge, edge + 1, edge - 1,
                           np.array([0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0x7F800001, 0xFF800001,
                                     0x7FA00000, 0x007FFFFF, 0x807FFFFF], dtype=np.uint32)])
    binade_starts = np.array([(s << 31) | (e << 23) for s in (0, 1) for e in range(256)],
                             dtype=np.int64) - width // 2
    binades = _windows(binade_starts, width)
    vals = rng.uniform(-127.0, 8.0, 2048).astype(np.float32)
    dense_val = _windows(_f2b(vals).astype(np.int64), width)
    lo_neg, hi_neg = int(_f2b(-0.0)), int(_f2b(-127.0))      # 0x80000000 .. 0xC2FE0000
    neg_bits = rng.integers(lo_neg, hi_neg - width, 256, dtype=np.int64)
    pos_bits = rng.integers(0, int(_f2b(8.0)) - width, 256, dtype=np.int64)
    dense_bits = _windows(np.concatenate([neg_bits, pos_bits]), width)
    sub126 = _windows(rng.integers(int(_f2b(-126.0)), int(_f2b(-127.0)) - width, 64,
                                   dtype=np.int64), width)
    tiny = _windows(rng.integers(int(_f2b(-0.0)), int(_f2b(-2.0**-25)) - width, 64,
                                 dtype=np.int64), width)
    rand_bits = rng.integers(0, 1 << 32, 100_000, dtype=np.int64).astype(np.uint32)
    rand_val = _f2b(rng.uniform(-127.0, 8.0, 100_000).astype(np.float32))
    x = np.unique(np.concatenate([edge, binades, dense_val, dense_bits, sub126, tiny, rand_bits,
                                  rand_val]).astype(np.uint32))
    x = x[sort_by_value(x)]
    if x.size % 2:
        x = x[:-1] if np.isnan(x[-1:].view(np.float32)).all() else np.append(x, np.uint32(0x7FC00001))
    return x


#: fp32 exponent-argument scales c = softmax_scale * log2(e) for head dims 64, 128, 256, and a
#: "random" one, as FA4 computes them in fp32 (flash_attn/cute/softmax.py).
EXPARG_SCALES = tuple(float(np.float32(np.float32(1.0 / np.sqrt(np.float64(d))) * np.float32(1.4426950408889634)))
                      for d in (64, 128, 256)) + (float(np.float32(0.3183098861837907)),)


def exparg_inputs(n_per_scale: int = 40_000, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """(S, m) fp32 pairs for the SM90 exponent-argument probe, as uint32: scores uniform in
    [-40, 40] and in [-2^-10, 2^-10]; row max m = S (a row's own max, half the samples), m = S +
    |N(0,4)|, or random. Length ``n_per_scale``."""
    rng = np.random.default_rng(seed)
    n = n_per_scale
    s = np.concatenate([rng.uniform(-40, 40, n - n // 8), rng.uniform(-2**-10, 2**-10, n // 8)])
    s = s.astype(np.float32)
    kind = rng.integers(0, 4, n)
    m = np.where(kind < 2, s, np.where(kind == 2, s + np.abs(rng.normal(0, 4, n)),
                                        rng.uniform(-40, 40, n))).astype(np.float32)
    return s.view(np.uint32), m.view(np.uint32)
