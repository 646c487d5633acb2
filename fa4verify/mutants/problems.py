"""The fixed battery of the mutant suite: its attention problems and their deterministic inputs."""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Literal

import numpy as np

from fa4verify.mutants.catalogue import Arch

# ============================================================================== the battery
@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention problem of the fixed battery (layout (batch, seqlen, nheads, headdim)).

    ``kind``: ``"randn"`` (N(0,1) inputs rounded to ``dtype``), ``"peaked"`` (rows whose running
    max grows across KV tiles by ``growth`` log2 units -- near FA4's lazy-rescale threshold of 8),
    ``"nan"`` (a NaN in one key, so one score column of every row is NaN; one NaN key per head,
    placed at the KV columns in ``nan_cols``). ``dtype`` is the input dtype ("bf16" or "fp8",
    e4m3fn; fp8 output and reference are bf16). ``bwd``: run the backward pass too.
    """

    name: str
    seqlen_q: int
    seqlen_k: int
    head_dim: int = 64
    batch: int = 1
    nheads: int = 1
    causal: bool = False
    dtype: Literal["bf16", "fp8"] = "bf16"
    kind: Literal["randn", "peaked", "nan"] = "randn"
    growth: tuple[float, ...] = ()
    nan_cols: tuple[int, ...] = ()
    bwd: bool = True
    archs: tuple[Arch, ...] = ("sm90", "sm100")
    note: str = ""

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def describe(self) -> str:
        bits = [f"{self.dtype} b{self.batch} h{self.nheads} d{self.head_dim}",
                f"sq={self.seqlen_q} sk={self.seqlen_k}"]
        if self.causal:
            bits.append("causal")
        if self.kind != "randn":
            bits.append(self.kind)
        return " ".join(bits)


def battery(profile: Literal["quick", "full"] = "quick") -> tuple[Problem, ...]:
    """The fixed battery. ``quick`` keeps every problem tiny (CI, < ~1 min for the whole suite);
    ``full`` adds larger and more varied shapes. Every problem exists for a reason written in its
    ``note``; the mutants each need at least one problem that exposes them."""
    q: list[Problem] = [
        Problem("tile_edge", 64, 130, nheads=2, note="one full 128-key tile + a 2-key tail; bwd"),
        Problem("causal_sq_lt_sk", 48, 200, causal=True,
                note="bottom-right causal, seqlen_q < seqlen_k, partial tail tile"),
        Problem("causal_sq_gt_sk", 150, 70, causal=True, bwd=True,
                note="bottom-right causal, seqlen_q > seqlen_k: fully masked first rows"),
        Problem("peaked_rescale", 32, 384, kind="peaked", growth=(5.0, 7.9, 8.1, 9.0, 12.0),
                note="row max grows across KV tiles by 5..12 log2 units (threshold 8)"),
        Problem("long_kv", 24, 700, head_dim=32, nheads=1,
                note="6 KV tiles (partial tail): the dQ reduce-add order over >= 3 blocks "
                     "changes fp32 sums"),
        Problem("nan_scores", 16, 128, nheads=2, kind="nan", nan_cols=(44, 3), bwd=False,
                note="a NaN key at column 44 (emulated on SM100 hd64) in head 0 and column 3 "
                     "(MUFU) in head 1"),
        Problem("fp8_peaked", 32, 256, dtype="fp8", kind="peaked", growth=(1.5, 2.5, 3.5),
                bwd=False, archs=("sm100",),
                note="fp8 (SM100 only, fwd only): row max grows by 1.5..3.5 log2 units, where "
                     "the old threshold 4 skips the rescale and P*2^8 saturates e4m3"),
    ]
    if profile == "quick":
        return tuple(q)
    if profile != "full":
        raise ValueError(f"unknown profile {profile!r}; expected 'quick' or 'full'")
    full = q + [
        Problem("square_256", 256, 256, head_dim=128, nheads=3, note="hd128, two full tiles"),
        Problem("odd_113_203", 113, 203, head_dim=64, batch=2, note="odd lengths from upstream"),
        Problem("causal_255_256", 255, 256, causal=True, head_dim=128,
                note="upstream's (255,256) causal"),
        Problem("causal_square_257", 257, 257, causal=True, head_dim=64,
                note="square causal, 1-key tail tile"),
        Problem("peaked_rescale_hd128", 64, 512, head_dim=128, kind="peaked",
                growth=(6.0, 7.95, 8.05, 10.0, 16.0, 20.0), note="more growth values, hd128"),
        Problem("nan_scores_hd128", 32, 256, head_dim=128, nheads=2, kind="nan", nan_cols=(40, 100),
                bwd=False, note="NaN at column 40 (emulated for hd128 pack/2-CTA configs) and 100"),
        Problem("fp8_randn", 64, 256, dtype="fp8", bwd=False, archs=("sm100",),
                note="fp8 without peaks"),
        Problem("fp8_peaked_hd128", 64, 384, head_dim=128, dtype="fp8", kind="peaked",
                growth=(0.5, 2.0, 3.5, 6.0), bwd=False, archs=("sm100",), note="fp8 peaks, hd128"),
    ]
    return tuple(full)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])


def _round_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    from fa4verify.oracles import binary32 as b32
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return b32.to_bf16(x)
    if dtype == "fp8":
        return b32.to_fp8_e4m3fn(x)
    raise ValueError(f"unsupported dtype {dtype!r}")


@dataclasses.dataclass(frozen=True)
class ProblemData:
    """Inputs of one problem: float32 arrays holding exactly representable values of
    ``problem.dtype`` (q, k, v) and of bf16 (dout)."""

    problem: Problem
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray


def make_inputs(p: Problem, seed: int = 0) -> ProblemData:
    """Deterministic inputs for ``p`` (depend only on ``seed`` and ``p.name``)."""
    rng = _rng(seed, p.name)
    b, sq, sk, h, d = p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.head_dim
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, h, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, h, d)).astype(np.float32)
    if p.kind == "peaked":
        # FA4 visits KV tiles (of 128 keys) from the last to the first. Rows are split into groups
        # j = i % len(growth); row i's query is 4*e_(1+j) plus small noise; keys are small noise
        # (scores ~0) except, in every tile t but the last, key t*128 + 5 + 7j = gamma_{t,j} *
        # e_(1+j) with a score of (n_tiles-1-t) * growth[j] log2 units (x = S * scale * log2 e).
        # Rows of group j (and only they: the other groups' queries are orthogonal) see their
        # running max grow by growth[j] at each tile boundary; the peak is in MUFU column 5 + 7j.
        ngr = len(p.growth)
        if ngr == 0 or 1 + ngr > d:
            raise ValueError(f"{p.name}: peaked needs 1 <= len(growth) < head_dim")
        c = p.softmax_scale * math.log2(math.e)
        big = np.float32(4.0)
        q *= np.float32(0.05)
        k *= np.float32(0.01)  # noise scores: |x| <~ 0.02 log2 units, << the 0.1 margins below
        for i in range(sq):
            q[:, i, :, 1:1 + ngr] = 0.0
            q[:, i, :, 1 + i % ngr] = big
        n_tiles = -(-sk // 128)
        for t in range(n_tiles - 1):
            for j, g in enumerate(p.growth):
                col = t * 128 + 5 + 7 * j
                k[:, col, :, :] = 0.0
                k[:, col, :, 1 + j] = np.float32((n_tiles - 1 - t) * g / (c * float(big)))
    q = _round_dtype(q, p.dtype)
    k = _round_dtype(k, p.dtype)
    v = _round_dtype(v, p.dtype)
    if p.kind == "nan":
        for h_idx, col in enumerate(p.nan_cols):
            if h_idx < h and col < sk:
                k[:, col, h_idx, 0] = np.float32(np.nan)
    dout = _round_dtype(rng.standard_normal((b, sq, h, d)).astype(np.float32), "bf16")
    return ProblemData(p, q, k, v, dout)
