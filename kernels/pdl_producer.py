"""A producer kernel that lets the kernel after it start at once (Note [Early trigger]).

Note [Early trigger]
--------------------
With programmatic dependent launch (PDL) a kernel launched with the attribute "programmatic
stream serialization allowed" -- FA4's backward preprocess and SM90 main kernel (Note [Backward
under load], ``fa4verify.races``) -- may start while the kernel before it on its stream is
still running, as soon as every block of that kernel has executed
``griddepcontrol.launch_dependents`` (or exited). Its ``griddepcontrol.wait`` then blocks until
that kernel has completed and its writes are visible. A kernel that drops the wait reads its
inputs while their producer may still be writing them.

A producer written with torch (a copy) never triggers: its dependents start only once all of its
blocks have exited, and a dropped wait reads inputs that are, in practice, already written
(measured on the H200, 2026-12-02: the planted preprocess wait was not caught with a torch copy
producing dO). The producer here is the producer of a training step at its most demanding for the
consumer: every block triggers its dependents first, then spins ``spin`` SM clock cycles
(``clock64``), then copies ``src`` into ``dst``. A consumer that waits as PDL requires reads the
whole copy; one that does not reads ``dst`` before it is written (NaN when the race harness
poisoned it first: Note [Poisoned scratch]).

The grid is at most two blocks per SM of the H200 (264), so on an otherwise idle GPU every block
is resident at once and the trigger is not held back by blocks waiting for a slot. Under the race
harness's busy stream some blocks may start late; the dependents then start when the last block
has triggered, and the blocks that started first may have written their part of ``dst``: a
dropped wait still reads the late blocks' part unwritten (the detection degrades, it does not
turn into a false alarm). The kernel copies 16-bit words (dO's
bf16/fp16 bits), so one compiled kernel serves both dtypes; shapes are static: one compile per
element count (< 0.1 s each).

GPU-only at run time; :func:`compile_only` builds it for ``sm_90a`` on any machine
(``CUTE_DSL_ARCH`` set before the DSL is imported).
"""
from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

BLOCK = 256
#: at most two blocks per SM of an H200 (132 SMs): every block resident, so every block triggers
MAX_GRID = 264
#: default spin: 2^20 SM clock cycles, about 0.5 ms at the H200's 1.98 GHz boost clock
SPIN = 1 << 20


@cute.kernel
def _kernel(gSrc: cute.Tensor, gDst: cute.Tensor, spin: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    cute.arch.griddepcontrol_launch_dependents()       # the dependents may start now
    t0 = cute.arch.clock64()
    t = t0
    while t - t0 < cutlass.Int64(spin):                  # spin ``spin`` SM clock cycles
        t = cute.arch.clock64()
    n = cute.size(gSrc)
    for j in cutlass.range(bidx * BLOCK + tidx, n, gdim * BLOCK):
        gDst[j] = gSrc[j]


@cute.jit
def _launch(mSrc: cute.Tensor, mDst: cute.Tensor, spin: cutlass.Int32, stream: cuda.CUstream):
    n = cute.size(mSrc)
    grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
    _kernel(mSrc, mDst, spin).launch(grid=[grid, 1, 1], block=[BLOCK, 1, 1], stream=stream)


#: compiled producers by (CUDA device index, element count)
_COMPILED: dict[tuple[int, int], Any] = {}


def _words(t: Any) -> Any:
    """``t`` (contiguous, 16-bit elements) as a flat int16 view of the same memory."""
    import torch
    if t.element_size() != 2 or not t.is_contiguous():
        raise ValueError("the early-trigger producer copies contiguous 16-bit tensors")
    return t.view(torch.int16).reshape(-1)


def supported(src: Any, dst: Any) -> bool:
    """Whether :func:`produce` can copy ``src`` into ``dst`` (CUDA, contiguous, 16-bit, same size)."""
    return (getattr(src, "is_cuda", False) and getattr(dst, "is_cuda", False) and src.element_size() == 2
            and dst.element_size() == 2 and src.is_contiguous() and dst.is_contiguous()
            and src.numel() == dst.numel() and src.numel() > 0)


def produce(src: Any, dst: Any, spin: int = SPIN) -> None:
    """Launch, on torch's current stream of ``src``'s device, the kernel that triggers its
    dependents, spins, then copies ``src`` into ``dst`` (Note [Early trigger])."""
    import torch
    from cutlass.cute.runtime import from_dlpack
    s, d = _words(src), _words(dst)
    key = (int(src.device.index or 0), s.numel())
    args = (from_dlpack(s, assumed_align=2), from_dlpack(d, assumed_align=2))
    with torch.cuda.device(src.device):
        stream = cuda.CUstream(torch.cuda.current_stream(src.device).cuda_stream)
        if key not in _COMPILED:
            _COMPILED[key] = cute.compile(_launch, *args, cutlass.Int32(int(spin)), stream)
        _COMPILED[key](*args, cutlass.Int32(int(spin)), stream)


def compile_only(n: int = 4 * BLOCK) -> str:
    """Compile the producer for the arch in ``CUTE_DSL_ARCH`` on CPU tensors of ``n`` elements;
    returns its PTX (empty when the DSL keeps none)."""
    import torch
    from cutlass.cute.runtime import from_dlpack
    s, d = torch.zeros(n, dtype=torch.int16), torch.zeros(n, dtype=torch.int16)
    fn = cute.compile(_launch, from_dlpack(s, assumed_align=2), from_dlpack(d, assumed_align=2),
                      cutlass.Int32(SPIN), cuda.CUstream(0))
    return getattr(fn, "__ptx__", None) or ""
