import math, sys
import cutlass, cutlass.cute as cute
from cutlass import Int32, BFloat16
from cutlass.cute.nvgpu import cpasync
from cutlass.utils import LayoutEnum
from quack import sm90_utils

HD = int(sys.argv[1]); TILE_N = int(sys.argv[2]) if len(sys.argv)>2 else 144
@cute.jit
def probe():
    sK_layout = sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (TILE_N, HD), 2)
    print("sK_layout", sK_layout)
    dtype = BFloat16
    async_copy_elems = 128 // 16
    gk = math.gcd(HD, HD, 64)
    tpr = gk // async_copy_elems
    num_threads = 128
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128)
    thr_layout = cute.make_ordered_layout((num_threads // tpr, tpr), order=(1, 0))
    val_layout = cute.make_layout((1, async_copy_elems))
    tc = cute.make_tiled_copy_tv(atom, thr_layout, val_layout)
    print("tpr", tpr, "tiler", tc.tiler_mn, "layout_tv", tc.layout_tv_tiled)
    cX = cute.make_identity_tensor((TILE_N, HD))
    for tid in [0, 1, 2, 31, 32, 64, 127]:
        thr = tc.get_slice(tid)
        t = thr.partition_S(cX)
        print("tid", tid, "tXcX layout", t.layout, "size mode1", cute.size(t, mode=[1]))
        for m in range(cute.size(t, mode=[1])):
            print("   m", m, "coord", t[0, m, 0], "last k", t[0, m, cute.size(t, mode=[2])-1])
    # smem partition: use a real smem-like tensor with a fake pointer
    ptr = cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=1024)
    sK = cute.make_tensor(ptr, sK_layout)
    for st in range(2):
        sX = sK[None, None, st]
        sX_pi = cute.group_modes(sX, 0, 1)
        print("sX_pi", sX_pi.layout if hasattr(sX_pi,'layout') else sX_pi)
        for tid in [0, 1, 127]:
            ts = tc.get_slice(tid).partition_D(sX_pi)
            print("tid", tid, "tXsX", ts.layout, ts.iterator)
probe()
