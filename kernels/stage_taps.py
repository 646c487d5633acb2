"""Production stage taps: FA4's backward observed stage by stage (subject side).

FA4's backward (``flash_attn.cute.interface._flash_attn_bwd``) runs three kernels:

1. preprocess (``_bwd_preprocess``): ``dpsum = D = rowsum(dO * O)`` (fp32, (b, h, s_rounded)),
   ``lse_log2 = lse * log2(e)`` and ``dq_accum`` zeroed;
2. the main kernel: dK, dV and the fp32 ``dq_accum`` (dQ / softmax_scale, FA4's tile layout);
3. postprocess (``_bwd_postprocess_convert``): ``dq = (dq_accum * scale).to(dtype)``.

:func:`capture_backward_stages` wraps FA4's own two drivers (module attributes of
``interface``, looked up by ``_flash_attn_bwd`` at call time) **only inside its ``with``
block** and restores them after; the wrappers call FA4's drivers unchanged and clone the
buffers FA4 allocated: after the preprocess ``dpsum``, ``lse_log2`` and the zeroed ``dq_accum``;
before the dQ postprocess the main kernel's ``dq_accum``.

``dq_accum`` is stored in FA4's per-tile order. :meth:`BackwardTaps.dq_accum_logical` reads it
back in (b, s, h, d) through FA4's own postprocess: it feeds the postprocess (scale 1) three
probe accumulators holding the base-256 digits of every flat index (integers <= 255 are exact in
bf16 and fp16), so the index map is the one production's postprocess reads, never a layout
guessed here.

The adapter stays the only importer of ``flash_attn.cute``: the interface module comes from
:func:`fa4verify.kernels.adapter.interface_module`, or is passed in (tests pass a fake).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

__all__ = ["BackwardTaps", "capture_backward_stages", "backward_with_taps"]


@dataclasses.dataclass
class BackwardTaps:
    """Buffers observed in one FA4 backward (torch tensors, device of the run)."""

    dpsum: Any = None              #: D after the preprocess, fp32 (b, h, s_rounded) / (h, total_padded)
    lse_log2: Any = None           #: lse * log2 e after the preprocess, same layout
    dq_accum_zeroed: Any = None    #: dq_accum right after the preprocess (must be all zero)
    dq_accum: Any = None           #: dq_accum as the main kernel left it (before scale and cast)
    dq_scale: Optional[float] = None   #: the scale the dQ postprocess applies (softmax_scale)
    preprocess_calls: int = 0
    postprocess_calls: int = 0
    _post: Any = dataclasses.field(default=None, repr=False)        # FA4's postprocess driver
    _post_args: Any = dataclasses.field(default=None, repr=False)   # its dQ call (args, kwargs)
    _dq_accum_obj: Any = dataclasses.field(default=None, repr=False)

    def dq_accum_logical(self, like):
        """``dq_accum`` (fp32) read back as ``like``'s shape (b, s, h, d), decoded through FA4's
        own postprocess (module docstring). Raises RuntimeError when nothing was captured or the
        decoded map is not a one-to-one map into the buffer."""
        import torch
        if self.dq_accum is None or self._post is None:
            raise RuntimeError("no dQ postprocess was captured (hd-256 dedicated path or no launch)")
        args, kw = self._post_args
        acc = self.dq_accum
        n = int(acc.shape[-1])
        if acc.dim() != 3:
            raise RuntimeError(f"dq_accum_logical: varlen dq_accum {tuple(acc.shape)} not supported")
        idx = torch.arange(n, device=acc.device, dtype=torch.int64)
        flat = torch.zeros(like.shape, dtype=torch.int64, device=acc.device)
        kw = dict(kw)
        kw["sink_tensors"] = None
        for p in range(3):
            digit = ((idx // (256 ** p)) % 256).to(torch.float32)
            probe = digit.expand(acc.shape).contiguous()
            outp = torch.empty(like.shape, dtype=like.dtype, device=acc.device)
            self._post(probe, outp, 1.0, *args, **kw)
            flat += outp.to(torch.int64) * (256 ** p)
        b, s, h, d = like.shape
        if int(flat.min()) < 0 or int(flat.max()) >= n:
            raise RuntimeError("dq_accum_logical: decoded index out of range")
        per_bh = flat.permute(0, 2, 1, 3).reshape(b, h, s * d)
        for bi in range(b):
            for hi in range(h):
                if torch.unique(per_bh[bi, hi]).numel() != s * d:
                    raise RuntimeError("dq_accum_logical: decoded index map is not one-to-one")
        vals = torch.gather(acc, 2, per_bh)
        return vals.reshape(b, h, s, d).permute(0, 2, 1, 3).contiguous()


@contextlib.contextmanager
def capture_backward_stages(interface=None) -> Iterator[BackwardTaps]:
    """Within the block, every ``_flash_attn_bwd`` of ``interface`` (default: FA4's, from the
    adapter) records its stage buffers into the yielded :class:`BackwardTaps`. FA4's drivers are
    restored on exit, also on error."""
    if interface is None:
        from fa4verify.kernels.adapter import interface_module
        interface = interface_module()
    taps = BackwardTaps()
    orig_pre = interface._bwd_preprocess
    orig_post = interface._bwd_postprocess_convert

    def pre(out, dout, dpsum, lse, lse_log2, dq_accum, *args, **kw):
        orig_pre(out, dout, dpsum, lse, lse_log2, dq_accum, *args, **kw)
        taps.preprocess_calls += 1
        if not kw.get("fake_mode", False):
            taps.dpsum = dpsum.clone()
            taps.lse_log2 = None if lse_log2 is None else lse_log2.clone()
            taps.dq_accum_zeroed = None if dq_accum is None else dq_accum.clone()
        taps._dq_accum_obj = dq_accum

    def post(accum, output, scale, *args, **kw):
        taps.postprocess_calls += 1
        if accum is not None and accum is taps._dq_accum_obj and not kw.get("fake_mode", False):
            taps.dq_accum = accum.clone()
            taps.dq_scale = float(scale)
            taps._post = orig_post
            taps._post_args = (args, dict(kw))
        orig_post(accum, output, scale, *args, **kw)

    for w, o in ((pre, orig_pre), (post, orig_post)):
        if hasattr(o, "compile_cache"):
            w.compile_cache = o.compile_cache
    interface._bwd_preprocess = pre
    interface._bwd_postprocess_convert = post
    try:
        yield taps
    finally:
        interface._bwd_preprocess = orig_pre
        interface._bwd_postprocess_convert = orig_post


def backward_with_taps(q, k, v, out, dout, lse, *, interface=None, **kw):
    """:func:`fa4verify.kernels.adapter.backward` with its stages captured:
    ``(BackwardResult, BackwardTaps)``."""
    from fa4verify.kernels import adapter
    with capture_backward_stages(interface) as taps:
        res = adapter.backward(q, k, v, out, dout, lse, **kw)
    return res, taps
