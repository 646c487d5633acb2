"""Dump the SM90 dQ/dKV accumulator maps with CuTe's own host-side layout algebra (no GPU).

For one (tile_m, tile_hdim, num_wg, atom_layout, swapAB) configuration it rebuilds exactly what
flash_bwd_sm90.py (writer) and flash_bwd_postprocess.py (reader) build:
  * the WGMMA tiled MMA (sm90_utils_basic.make_trivial_tiled_mma, flash_bwd_sm90.py:293-303,
    flash_bwd_postprocess.py:212-225) -> for thread tidx, register i: (row, col) of the tile
    (acc is a compact rmem tensor, quack/sm90_utils.py:193/228, so register i <-> colex index i);
  * the R2S / S2R copy (flash_bwd_sm90.py:247-252, flash_bwd_postprocess.py:283-289) applied to
    the (tile_m*tile_hdim/num_wg, num_wg) flat buffer (flash_bwd_sm90.py:243-245,
    postprocess 290-292), with the registers re-viewed as make_layout(partition.shape)
    (flash_bwd_sm90.py:1621-1624, postprocess 613-614) -> for tidx, register i: flat offset.
Run:  CUTE_DSL_ARCH=sm_90a python cute_maps.py   (writes cute_maps.npz next to this file)
"""
import os
import numpy as np
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils_basic
from cutlass.cute.nvgpu import warpgroup
from cutlass import Float32

# (name, tile_m, tile_hdim, num_wg, atom_layout_mn (as in the non-swapped code), swapAB)
CONFIGS = []
for D in (16, 32, 48, 64, 80, 96, 112, 128):
    CONFIGS.append((f"T128_wg2_atom21_D{D}", 128, D, 2, (2, 1), False))   # hd<=64 dQ; GQA dK/dV
for D in (80, 96):
    CONFIGS.append((f"T64_wg1_atom11_D{D}", 64, D, 1, (1, 1), False))     # hd 65..96 dQ (single WG)
for D in (112, 128):
    CONFIGS.append((f"T64_wg2_atom12_D{D}", 64, D, 2, (1, 2), False))     # hd 97..128 causal dQ
CONFIGS.append(("T80_wg2_atom12swap_D128", 80, 128, 2, (1, 2), True))     # hd 97..128 non-causal

_out = {}


def _dump_all():
    # plain Python (not AST-rewritten); called from inside cute.jit so an MLIR context exists
    for name, T, D, nwg, atom, swap in CONFIGS:
        atom_mnk = (atom[1], atom[0], 1) if swap else (atom[0], atom[1], 1)
        tiler = (T // atom[0], D // atom[1])
        tm = sm90_utils_basic.make_trivial_tiled_mma(
            cutlass.BFloat16, cutlass.BFloat16,
            warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            atom_layout_mnk=atom_mnk,
            tiler_mn=(64, tiler[1] if not swap else tiler[0]),
        )
        mma_shape = (T, D) if not swap else (D, T)
        ident = cute.make_identity_tensor(mma_shape)
        L = T * D // nwg
        cp = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128),
            cute.make_layout((128, nwg)),
            cute.make_layout(4),
        )
        sident = cute.make_identity_tensor((L, nwg))
        nthr = 128 * nwg
        assert tm.size == nthr
        coords = None
        offs = None
        for t in range(nthr):
            p = tm.get_slice(t).partition_C(ident)
            d = cp.get_slice(t).partition_D(sident)
            n = cute.size(p)
            assert n == cute.size(d)
            if coords is None:
                coords = np.zeros((nthr, n, 2), np.int64)
                offs = np.zeros((nthr, n), np.int64)
            for i in range(n):
                rc = p[i]
                if swap:
                    rc = (rc[1], rc[0])
                coords[t, i] = rc
                pos, g = d[i]
                offs[t, i] = pos + L * g
        _out[name + "_coords"] = coords
        _out[name + "_offs"] = offs
        print(name, coords.shape, flush=True)


@cute.jit
def dump():
    _dump_all()


if __name__ == "__main__":
    dump()
    np.savez(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cute_maps.npz"), **_out)
