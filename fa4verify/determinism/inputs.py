"""Inputs of one determinism configuration: drawn on the CPU from the configuration's seed, so every
process and device gets the same bits."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from fa4verify.determinism.bitwise import _torch, digest
from fa4verify.determinism.configs import _TORCH_DTYPES, DeterminismConfig

@dataclass
class Problem:
    """Inputs of one configuration on one device (torch tensors)."""
    cfg: DeterminismConfig
    q: Any
    k: Any
    v: Any
    dout: Any
    sink: Any = None
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    softmax_scale: float = 0.0

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.q, self.k, self.v, self.dout, self.sink, self.cu_seqlens_q,
                  self.cu_seqlens_k):
            h.update(b"none" if t is None else digest(t).encode())
        return h.hexdigest()


def make_inputs(cfg: DeterminismConfig, device: str = "cpu") -> Problem:
    """Inputs from ``cfg.seed``, drawn on the CPU (``torch.Generator``) in fp32 and rounded to the
    dtype, then moved to ``device`` -- so every process and device gets the same bits. q is scaled
    by softcap/4 when softcap is on (as upstream's tests do, so scores reach the cap)."""
    torch = _torch()
    g = torch.Generator(device="cpu").manual_seed(int(cfg.seed))
    dt = getattr(torch, _TORCH_DTYPES[cfg.dtype])
    if cfg.varlen:
        tq, tk = sum(cfg.seqlens_q), sum(cfg.seqlens_k)
        sq_shape, sk_shape = (tq,), (tk,)
    else:
        sq_shape, sk_shape = (cfg.batch, cfg.seqlen_q), (cfg.batch, cfg.seqlen_k)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    q = rnd(*sq_shape, cfg.nheads, cfg.head_dim)
    if cfg.softcap:
        q = q * (cfg.softcap / 4)
    k = rnd(*sk_shape, cfg.nheads_kv, cfg.head_dim)
    v = rnd(*sk_shape, cfg.nheads_kv, cfg.hdv)
    dout = rnd(*sq_shape, cfg.nheads, cfg.hdv)
    sink = rnd(cfg.nheads) if cfg.sink else None
    p = Problem(cfg, *(t.to(dt).to(device) for t in (q, k, v, dout)),
                softmax_scale=1.0 / math.sqrt(cfg.head_dim))
    if sink is not None:
        p.sink = sink.to(device)  # fp32 sink -> fp32 dsink
    if cfg.varlen:
        cq = [0]
        for s in cfg.seqlens_q:
            cq.append(cq[-1] + s)
        ck = [0]
        for s in cfg.seqlens_k:
            ck.append(ck[-1] + s)
        p.cu_seqlens_q = torch.tensor(cq, dtype=torch.int32, device=device)
        p.cu_seqlens_k = torch.tensor(ck, dtype=torch.int32, device=device)
        p.max_seqlen_q, p.max_seqlen_k = max(cfg.seqlens_q), max(cfg.seqlens_k)
    return p
