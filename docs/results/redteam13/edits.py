"""Proposed single-edit faults in branch sides / configurations no SM90 bf16 audit call reaches at
seed 0 (census0.pkl). Each: id, FA4 file (relative to flash_attn/cute), old text (must occur exactly
once in the installed file), new text, the smallest FA4 call that reaches it, why nothing reaches it.
`python edits.py` checks exactly-once and byte-compiles each patched copy under
/work/dev24/redteam13/patched/<id>/ (nothing under /work/main is touched).
All six are guarded faults: they model a variant-specific defect: the guard is FA4's own compile-time attributes
of the unreached configuration, so the edit changes values there only."""
import os, py_compile, sys
FA = "/work/main/.venv/lib/python3.11/site-packages/flash_attn/cute"
OUT = "/work/dev24/redteam13/patched"
DK = "                    acc_dK.store(acc_dK.load() * softmax_scale)"
def dk(guard):
    return ("                    acc_dK.store(acc_dK.load() * (softmax_scale * 1.0078125 if const_expr("
            + guard + ") else softmax_scale))")
SC_OLD = "        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n            softmax_scale, self.score_mod\n        )"
def sc(guard):
    return ("        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n"
            "            softmax_scale * (1.0078125 if (" + guard + ") else 1.0), self.score_mod\n        )")
EDITS = [
 dict(id="sm90_bwd_hd64_causal_mha_nondet_dk_scale", file="flash_bwd_sm90.py", old=DK,
      new=dk("self.tile_hdim <= 64 and self.is_causal and self.qhead_per_kvhead == 1 and not self.deterministic"),
      call="flash_attn_func(q,k,v, causal=True) bf16 b1 s256 h2 hd64, backward deterministic=False",
      why="no hd<=64 causal MHA backward runs without deterministic (crosstab0.txt)"),
 dict(id="sm90_bwd_hd256_mha_nondet_dk_scale", file="flash_bwd_sm90.py", old=DK,
      new=dk("self.tile_hdim == 256 and self.qhead_per_kvhead == 1 and not self.deterministic"),
      call="flash_attn_func(q,k,v) bf16 b1 s256 h2 hd256 (any mask), backward deterministic=False",
      why="no hd 256 MHA backward runs without deterministic (none / causal / local)"),
 dict(id="sm90_bwd_hd96_causal_mha_dk_scale", file="flash_bwd_sm90.py", old=DK,
      new=dk("self.num_wg_dQ == 1 and self.is_causal and self.qhead_per_kvhead == 1"),
      call="flash_attn_func(q,k,v, causal=True) bf16 b1 s256 h2 hd96 (or 80), backward (either deterministic)",
      why="no causal MHA backward at hd 65-96 (dQ_single_wg tile 64x128)"),
 dict(id="sm90_bwd_mha_hd64_hdv128_dk_scale", file="flash_bwd_sm90.py", old=DK,
      new=dk("self.tile_hdim <= 64 and self.tile_hdimv > 64"),
      call="MHA backward hd 64, hdv 128 (b1 s256 h2); whether FA4 builds it is unchecked (round 11: some hd != hdv MHA backwards do not build)",
      why="the forward runs hd 64/hdv 128, the backward never does"),
 dict(id="sm90_fwd_hd192_hdv128_packgqa_scale", file="flash_fwd_sm90.py", old=SC_OLD,
      new=sc("self.pack_gqa and self.tile_hdim == 192 and self.tile_hdimv == 128 and self.tile_n == 128"),
      call="flash_attn_func(q,k,v) bf16 b1 s256 h4/hk2 hd192 hdv128 (non-local, causal or not), forward",
      why="tile 128x128 at hd 129-192/hdv<=128 runs only unpacked (2 calls)"),
 dict(id="sm90_fwd_tile_m64_causal_scale", file="flash_fwd_sm90.py", old=SC_OLD,
      new=sc("self.tile_m == 64 and (self.is_causal or self.is_local)"),
      call="block-sparse forward, hd 64, sparse block (64, 128), causal=True, b1 s256 h2",
      why="the one 1-warpgroup forward (tile_m 64: sparse Q block 64) is non-causal, non-local"),
]

def check():
    ok = True
    for e in EDITS:
        src = open(os.path.join(FA, e["file"])).read()
        n = src.count(e["old"])
        patched = src.replace(e["old"], e["new"], 1)
        d = os.path.join(OUT, e["id"]); os.makedirs(d, exist_ok=True)
        p = os.path.join(d, e["file"])
        open(p, "w").write(patched)
        try:
            py_compile.compile(p, cfile=p + "c", doraise=True); comp = "byte-compiles"
        except py_compile.PyCompileError as ex:
            comp = f"COMPILE ERROR {ex}"; ok = False
        line = src[:src.find(e["old"])].count("\n") + 1 if n else None
        print(f"{e['id']}: {e['file']}:{line} occurrences={n} {comp}")
        ok &= n == 1 and patched != src
    return ok

if __name__ == "__main__":
    sys.exit(0 if check() else 1)
