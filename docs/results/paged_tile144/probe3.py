import cutlass, cutlass.cute as cute
from cutlass import BFloat16
from cutlass.utils import LayoutEnum
from quack import sm90_utils
@cute.jit
def probe():
    L = sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (144, 96), 2)
    ptr = cute.make_ptr(BFloat16, 1 << 20, cute.AddressSpace.smem, assumed_align=1024)
    t = cute.make_tensor(ptr, L)
    print("tensor", t)
    for (r, c) in [(0,0),(0,8),(1,0),(1,8),(2,0),(4,0),(8,0),(0,16),(1,16),(9,0)]:
        sub = cute.local_tile(t[None, None, 0], (1, 8), (r, c // 8))
        print(r, c, sub.iterator)
probe()
