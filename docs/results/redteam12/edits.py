"""Exact-once check of the proposed faults against the installed FA4 (read only)."""
import os
from fa4verify.mutants.source import Edit, catalogue, installed_root
ROOT = installed_root() if callable(installed_root) else installed_root
EDITS = {m.id: m.edits[0] for m in catalogue(["sm90_bwd_accum_round64_widened", "score_mod_bwd_gqa_head_unscaled",
                                              "bwd_mask_mod_dropped_under_causal"])}
# the rejected candidate (analysis.md, "Rejected"): caught elsewhere, so not catalogued
EDITS["sm90_bwd_window_tile80"] = Edit("interface.py",
    "        is_causal_or_local = causal or local\n        m_block_size = 64 if is_causal_or_local else 80",
    "        is_causal_or_local = causal\n        m_block_size = 64 if is_causal_or_local else 80")
import pathlib
root = pathlib.Path(ROOT)
if not (root / "interface.py").exists():
    root = root / "cute"
for k, e in EDITS.items():
    src = (root / e.file).read_text()
    n = src.count(e.old)
    new = src.replace(e.old, e.new)
    compile(new, e.file, "exec")
    print(f"{k:40s} {e.file}:{src[:src.find(e.old)].count(chr(10))+1} occurrences={n} byte-compiles=ok")
