import cutlass, cutlass.cute as cute
from cutlass import BFloat16
from cutlass.utils import LayoutEnum
from quack import sm90_utils
@cute.jit
def probe():
    for hd in (80, 96, 64, 112, 128):
        print("hd", hd, "sQ", sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (192, hd), None),
              "sK", sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (144, hd), 2))
    print("sP 192x144", sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (192, 144), None))
    print("sP 192x128", sm90_utils.make_smem_layout(BFloat16, LayoutEnum.ROW_MAJOR, (192, 128), None))
probe()
