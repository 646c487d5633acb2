"""Exact-once check of the proposed faults against the installed FA4 (read only)."""
import os
from fa4verify.mutants.source import Edit, SourceMutant, installed_root
ROOT = installed_root() if callable(installed_root) else installed_root
EDITS = {
 "sm90_bwd_accum_round64_widened": Edit("interface.py",
    "hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 32",
    "hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 64"),
 "score_mod_bwd_gqa_head_unscaled": Edit("softmax.py",
    "            score_vec[j] = score_tensor[i + j] * softmax_scale\n\n"
    "            if cutlass.const_expr(qhead_per_kvhead > 1 and constant_q_idx is None):\n"
    "                q_idx_packed = index_tensor[i + j][q_idx_pos]\n"
    "                q_idx_logical = q_idx_packed // qhead_per_kvhead\n"
    "                head_offset = q_idx_packed - q_idx_logical * qhead_per_kvhead\n"
    "                head_idx_vec[j] = head_idx * qhead_per_kvhead + head_offset",
    "            score_vec[j] = score_tensor[i + j] * softmax_scale\n\n"
    "            if cutlass.const_expr(qhead_per_kvhead > 1 and constant_q_idx is None):\n"
    "                q_idx_packed = index_tensor[i + j][q_idx_pos]\n"
    "                q_idx_logical = q_idx_packed // qhead_per_kvhead\n"
    "                head_offset = q_idx_packed - q_idx_logical * qhead_per_kvhead\n"
    "                head_idx_vec[j] = head_idx + head_offset"),
 "sm90_bwd_window_tile80": Edit("interface.py",
    "        is_causal_or_local = causal or local\n        m_block_size = 64 if is_causal_or_local else 80",
    "        is_causal_or_local = causal\n        m_block_size = 64 if is_causal_or_local else 80"),
 "bwd_mask_mod_dropped_under_causal": Edit("interface.py",
    "    causal, local, window_size_left, window_size_right = _resolve_causal_local_window(\n"
    "        causal, window_size_left, window_size_right\n    )\n\n    if arch // 10 == 12:\n"
    "        # SM120: uses SM80 MMA with 99 KB SMEM, 128 threads (4 warps).\n        m_block_size = 64\n        n_block_size = 64",
    "    causal, local, window_size_left, window_size_right = _resolve_causal_local_window(\n"
    "        causal, window_size_left, window_size_right\n    )\n    if causal:\n        mask_mod = None\n\n    if arch // 10 == 12:\n"
    "        # SM120: uses SM80 MMA with 99 KB SMEM, 128 threads (4 warps).\n        m_block_size = 64\n        n_block_size = 64"),
}
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
