"""CPU checks of model.py: exact where FA4 is right, wrong where it is wrong."""
import numpy as np
from model import paged_tile144_forward, reference_forward, defect_geometry

def make(hd, P, sk, sq=256, H=2, Hk=2, B=1, seed=0):
    rng = np.random.default_rng(seed)
    nps = -(-sk // P); num_pages = B * nps + 3
    k = rng.standard_normal((num_pages, P, Hk, hd)); v = rng.standard_normal((num_pages, P, Hk, hd))
    q = rng.standard_normal((B, sq, H, hd))
    pt = rng.permutation(num_pages)[: B * nps].reshape(B, nps)
    return q, k, v, pt, [sk] * B

def stats(o, r, tol=0.01):
    d = np.abs(o - r); big = d[d > tol]
    return (f"off>{tol}: {100*np.mean(d > tol):5.1f}%  median {np.median(big) if big.size else 0:.2f}"
            f"  p99 {np.percentile(big, 99) if big.size else 0:.2f}  max {d.max():.2f}")

for hd in (80, 96):
    print(hd, defect_geometry(hd, 144))
for sk in (100, 300, 1000):
    for hd, P in [(64, 16), (112, 16), (128, 16), (80, 144), (96, 144), (80, 16), (96, 16), (80, 8), (96, 32), (96, 64), (80, 128)]:
        q, k, v, pt, sks = make(hd, P, sk)
        ref, lref = reference_forward(q, k, v, P, pt, sks, hd ** -0.5)
        for ow in (True, False):
            o, l = paged_tile144_forward(q, k, v, P, pt, sks, hd ** -0.5, hd, oob_wins=ow)
            print(f"sk={sk:4d} hd={hd:3d} P={P:3d} oob_wins={ow!s:5s} O {stats(o, ref)} | LSE maxdiff {np.nanmax(np.abs(l - lref)):.3f}")
            if hd in (64, 112, 128) or P == 144:
                break
