import os
import cutlass, cutlass.cute as cute
from cutlass import Int32, BFloat16, Boolean
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import from_dlpack
import torch

@cute.kernel
def kern(mA: cute.Tensor, lim: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    smem = cutlass.utils.SmemAllocator()
    sA = smem.allocate_tensor(BFloat16, cute.make_layout((64, 8), stride=(8, 1)), 16)
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16, num_bits_per_copy=128)
    tc = cute.make_tiled_copy_tv(atom, cute.make_layout((64, 1)), cute.make_layout((1, 8)))
    thr = tc.get_slice(tidx)
    gA = cute.make_tensor(cute.make_ptr(BFloat16, mA.iterator.toint(), cute.AddressSpace.gmem, assumed_align=16), mA.layout)
    tS = thr.partition_S(gA)
    tD = thr.partition_D(sA)
    pred = cute.make_fragment_like(tD[(0, None), 0, 0], cute.Boolean)
    pred.fill(tidx < lim)
    cute.copy(tc, tS[None, 0, 0], tD[None, 0, 0], pred=pred)
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)
    mA[tidx, 0] = sA[(tidx + 1) % 64, 0]

@cute.jit
def host(mA: cute.Tensor, lim: Int32):
    kern(mA, lim).launch(grid=[1, 1, 1], block=[64, 1, 1])

a = torch.zeros(64, 8, dtype=torch.bfloat16)
f = cute.compile(host, from_dlpack(a, assumed_align=16), Int32(3))
print("compiled")
