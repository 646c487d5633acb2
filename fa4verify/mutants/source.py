"""Production source mutants: kernel-code faults planted in a private, fingerprinted copy of the
installed ``flash_attn/cute`` and judged by the production checks.

How a mutant runs (Note [Private FA4 copy]):

1. :func:`make_copy` copies the installed ``flash_attn`` package (its ``cute`` subpackage is all
   FA4 ships) into a private directory, applies the mutant's textual edits -- each asserted to
   match the original source **exactly once** (:class:`EditError` otherwise) -- and writes a
   fingerprint: sha256 over every original file, the mutant id and every edit.
   The installed package is only read.
2. The engine runs :func:`fa4verify.mutants.source_worker.run` in a fresh worker of its own
   (:func:`fa4verify.run.engine.run_calls`) with :func:`worker_env`: ``PYTHONPATH=<copy>`` first and FA4's compile cache pointed at a directory named by the
   fingerprint (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``), so the cache can never serve the
   unpatched kernel; the worker asserts ``flash_attn.cute.__file__`` lies in the copy.
3. The worker runs one small forward and one small backward on the GPU, taps the backward's
   stages (:mod:`fa4verify.stages.taps`) and hands every tensor to every verifier of
   :data:`fa4verify.mutants.detection.VERIFIERS` (worst-case judge, FA's upstream rule,
   ``assert_close``; the statistical tier plugs in there).

Graded families (``recip_bias_2m7`` .. ``_2m13``, ``dpsum_bias_2m7`` .. ``_2m13``) give the
detection curve: the smallest bias each verifier catches, per tensor
(:func:`fa4verify.mutants.detection.detection_curve`).

The catalogue is ours; a hidden set kept apart from the project is run against the same
machinery (any :class:`SourceMutant` list can be passed to :func:`make_copy`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Optional, Sequence

__all__ = ["Edit", "SourceMutant", "EditError", "CATALOGUE", "catalogue", "installed_root",
           "source_digest", "apply_edits", "make_copy", "PrivateCopy", "worker_env", "GRADED"]


class EditError(RuntimeError):
    """A mutant's edit does not match its file exactly once (the source moved: update the
    catalogue, never loosen the check)."""


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` in ``file`` (relative to ``flash_attn/cute``); ``old`` must occur
    exactly once."""

    file: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class SourceMutant:
    """A kernel-code fault: ``edits`` applied together. ``stage``: "fwd", "bwd" or "both" (which
    problem shows it); ``family``/``bias``: graded families (bias = relative or absolute size);
    ``expect``: the tensors the fault is meant to reach (documentation; the worker judges all);
    ``determinism``: judged by bitwise reruns of the deterministic backward; ``hang``: the fault
    is a kernel that never finishes (Note [Planted hang]), judged by the audit's deadline, not by
    values, so the detection campaign (:mod:`fa4verify.mutants.source_run`) leaves it out unless
    named."""

    id: str
    title: str
    edits: tuple[Edit, ...]
    stage: str
    expect: tuple[str, ...]
    family: Optional[str] = None
    bias: Optional[float] = None
    determinism: bool = False
    hang: bool = False

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "stage": self.stage, "expect": list(self.expect),
                "family": self.family, "bias": self.bias, "determinism": self.determinism,
                "hang": self.hang,
                "edits": [dataclasses.asdict(e) for e in self.edits]}


def _recip(k: int) -> SourceMutant:
    return SourceMutant(
        f"recip_bias_2m{k}", f"1/rowsum in the forward finalize biased by 2^-{k} (O scaled)",
        (Edit("softmax.py",
              "cute.arch.rcp_approx(row_sum[r] if not acc_O_mn_row_is_zero_or_nan else 1.0)\n"
              "            ) * final_scale\n",
              "cute.arch.rcp_approx(row_sum[r] if not acc_O_mn_row_is_zero_or_nan else 1.0)\n"
              f"            ) * final_scale * (1.0 + 2.0 ** -{k})\n"),),
        "fwd", ("out",), family="recip_bias", bias=2.0 ** -k)


def _dpsum(k: int) -> SourceMutant:
    return SourceMutant(
        f"dpsum_bias_2m{k}", f"D = rowsum(dO*O) in the backward preprocess biased by 2^-{k}",
        (Edit("flash_bwd_preprocess.py",
              "                        PdPsum_val = PdP_sum[m]\n",
              f"                        PdPsum_val = PdP_sum[m] * (1.0 + 2.0 ** -{k})\n"),),
        "bwd", ("D", "dq", "dk"), family="dpsum_bias", bias=2.0 ** -k)


GRADED = (7, 9, 10, 11, 13)


def _sm90_bwd_offset_unswapped(callee: str) -> Edit:
    """The SM90 backward's tile offset of the (tile_m x tile_n) identity tensor handed to ``callee``
    (``apply_score_mod_inner``: the recompute of S; ``apply_score_mod_bwd_inner``: its derivative),
    taken in the transposed tile's order on the branch where S is not transposed (hd > 128)."""
    tail = ("            cS,\n"
            "        )\n"
            "        tScS = thr_mma_SdP.partition_C(cS)\n"
            "\n"
            f"        {callee}(\n")
    return Edit("flash_bwd_sm90.py",
                "            else (m_block * self.tile_m, n_block * self.tile_n),\n" + tail,
                "            else (n_block * self.tile_n, m_block * self.tile_m),\n" + tail)

CATALOGUE: tuple[SourceMutant, ...] = (
    *(_recip(k) for k in GRADED),
    *(_dpsum(k) for k in GRADED),
    SourceMutant(
        "p_cast_bias_2m8", "P fed to the PV MMA (the P cast input) biased by 2^-8; row sum unbiased",
        (Edit("softmax.py",
              "            row_sum[r] = acc_S_row_sum\n            acc_S_mn[r, None].store(acc_S_row_exp)\n",
              "            row_sum[r] = acc_S_row_sum\n"
              "            acc_S_mn[r, None].store(acc_S_row_exp * (1.0 + 2.0 ** -8))\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "softmax_scale_bias_2m9", "default softmax scale of the forward biased by 2^-9",
        (Edit("interface.py",
              "            1.0 / math.sqrt(head_dim) if qv is None or q is None\n"
              "            else 1.0 / math.sqrt(head_dim + head_dim_v)\n        )\n    if softcap == 0.0:\n",
              "            (1.0 + 2.0 ** -9) / math.sqrt(head_dim) if qv is None or q is None\n"
              "            else 1.0 / math.sqrt(head_dim + head_dim_v)\n        )\n    if softcap == 0.0:\n"),),
        "both", ("out", "lse")),
    SourceMutant(
        "lse_offset_2m12", "forward LSE offset by +2^-12 (natural log units)",
        (Edit("softmax.py",
              "                (row_max_scaled + cute.math.log2(row_sum_cur, fastmath=True)) * LN2\n",
              "                (row_max_scaled + cute.math.log2(row_sum_cur, fastmath=True)) * LN2"
              " + 2.0 ** -12\n"),),
        "both", ("lse", "dq", "dk", "dv")),
    SourceMutant(
        "mask_off_by_one", "SM90 causal mask admits one key past the diagonal",
        (Edit("mask.py",
              "                causal_row_offset = (\n"
              "                    1 + self.seqlen_k - n_block * self.tile_n - self.seqlen_q - thr_col_offset\n"
              "                )\n                if const_expr(mask_causal):\n",
              "                causal_row_offset = (\n"
              "                    2 + self.seqlen_k - n_block * self.tile_n - self.seqlen_q - thr_col_offset\n"
              "                )\n                if const_expr(mask_causal):\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "mask_window_left_off_by_one", "SM90 forward local mask drops the key at the window's left edge",
        (Edit("mask.py",
              "                        causal_row_offset - 1 - self.window_size_left\n",
              "                        causal_row_offset - self.window_size_left\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "mask_window_right_off_by_one", "SM90 forward local mask admits one key past the window's right edge",
        (Edit("mask.py",
              "                        causal_row_offset + self.window_size_right\n",
              "                        causal_row_offset + 1 + self.window_size_right\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "varlen_boundary_off_by_one", "varlen: each sequence's seqlen_k from cu_seqlens_k is one key short",
        (Edit("seqlen_info.py",
              "                else mCuSeqlensK[batch_idx + 1] - offset_k\n",
              "                else mCuSeqlensK[batch_idx + 1] - offset_k - 1\n"),),
        "both", ("out", "lse")),
    SourceMutant(
        "seqlen_tail_off_by_one", "SM90 mask admits one key past seqlen_k (the tail tile's padding)",
        (Edit("mask.py",
              "        if n_block < 0:\n            n_block = 0\n"
              "        seqlenk_col_limit = self.seqlen_k - n_block * self.tile_n - thr_col_offset\n"
              "        if const_expr(not mask_causal and not mask_local and mask_mod is None):\n",
              "        if n_block < 0:\n            n_block = 0\n"
              "        seqlenk_col_limit = self.seqlen_k - n_block * self.tile_n - thr_col_offset + 1\n"
              "        if const_expr(not mask_causal and not mask_local and mask_mod is None):\n"),),
        "both", ("out", "lse")),
    SourceMutant(
        "page_boundary_off_by_one", "paged KV (cp.async path): the last key of every page read from the key before it",
        (Edit("paged_kv.py",
              "            page_idx, page_offset = divmod(row_idx + self.leftpad_k, self.page_size_divmod)\n",
              "            page_idx, page_offset = divmod(row_idx + self.leftpad_k, self.page_size_divmod)\n"
              "            page_idx_next, _ = divmod(row_idx + self.leftpad_k + 1, self.page_size_divmod)\n"
              "            page_offset = page_offset - (page_idx_next - page_idx)\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "block_edge_off_by_one", "SM90 block-sparse forward (intra-warpgroup overlap, FA4's default): the first "
        "full KV block processed is masked as the next block",
        (Edit("block_sparse_utils.py",
              "            full_n_block = curr_full_block_idx[curr_full_block_cnt - 1]\n"
              "            if curr_mask_block_cnt == 0:\n                kv_consumer_state = process_first_half_block(\n",
              "            full_n_block = curr_full_block_idx[curr_full_block_cnt - 1] + 1\n"
              "            if curr_mask_block_cnt == 0:\n                kv_consumer_state = process_first_half_block(\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "varlen_sparse_offsets_ignored", "varlen block sparsity: each sequence's block lists are read from "
        "m_block_offset * its own KV block count, ignoring cu_block_idx_offsets (right only where every "
        "sequence has as many KV blocks)",
        (Edit("block_sparse_utils.py",
              "    batch_block_idx_offset = (\n"
              "        seqlen_info.block_idx_offset\n"
              "        if const_expr(seqlen_info.has_cu_block_idx_offsets)\n",
              "    batch_block_idx_offset = (\n"
              "        seqlen_info.m_block_offset * sparse_num_n_blocks\n"
              "        if const_expr(seqlen_info.has_cu_block_idx_offsets)\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "later_mask_blocks_unmasked", "SM90 block-sparse forward (intra-warpgroup overlap, FA4's default): a Q "
        "block's second and later mask blocks run without the mask_mod (attended whole, like full blocks)",
        (Edit("block_sparse_utils.py",
              "                    seqlen=seqlen_info,\n"
              "                    mma_pv_fn=partial(mma_pv_fn, zero_init=not O_should_accumulate),\n"
              "                    mask_fn=partial(mask_fn, mask_mod=mask_mod, mask_seqlen=False),\n",
              "                    seqlen=seqlen_info,\n"
              "                    mma_pv_fn=partial(mma_pv_fn, zero_init=not O_should_accumulate),\n"
              "                    mask_fn=partial(mask_fn, mask_mod=None, mask_seqlen=False),\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "packed_sparse_q_next_block", "SM90 block-sparse forward with packed GQA, cp.async Q load (tile_m not a "
        "multiple of the heads per KV head): the Q tile of the next m block is loaded",
        (Edit("flash_fwd_sm90.py",
              "                    else:\n"
              "                        pipeline_q.producer_acquire_w_index_phase(0, q_producer_phase)\n"
              "                        pack_gqa.load_Q(\n"
              "                            mQ_cur, sQ, gmem_tiled_copy_Q, tidx, m_block, seqlen.seqlen_q\n"
              "                        )\n"
              "                        cute.arch.cp_async_commit_group()\n"
              "                        pipeline_q.producer_commit_w_index(0)\n"
              "                        q_producer_phase ^= 1\n"
              "                    if is_kv_load_warp:\n",
              "                    else:\n"
              "                        pipeline_q.producer_acquire_w_index_phase(0, q_producer_phase)\n"
              "                        pack_gqa.load_Q(\n"
              "                            mQ_cur, sQ, gmem_tiled_copy_Q, tidx, m_block + 1, seqlen.seqlen_q\n"
              "                        )\n"
              "                        cute.arch.cp_async_commit_group()\n"
              "                        pipeline_q.producer_commit_w_index(0)\n"
              "                        q_producer_phase ^= 1\n"
              "                    if is_kv_load_warp:\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "dropped_rescale", "online-softmax rescale of O dropped in the SM90 forward main loop",
        (Edit("flash_fwd_sm90.py",
              "            cute.copy(smem_copy_params.smem_thr_copy_P, tPrP, smem_copy_params.tPsP)\n"
              "        softmax.rescale_O(acc_O, row_scale)\n",
              "            cute.copy(smem_copy_params.smem_thr_copy_P, tPrP, smem_copy_params.tPsP)\n"
              "        pass  # mutant: softmax.rescale_O(acc_O, row_scale) dropped\n"),
         Edit("flash_fwd_sm90.py",
              "        if const_expr(not self.rescale_O_before_gemm):\n"
              "            softmax.rescale_O(acc_O, row_scale)\n",
              "        if const_expr(not self.rescale_O_before_gemm):\n"
              "            pass  # mutant: softmax.rescale_O(acc_O, row_scale) dropped\n")),
        "fwd", ("out",)),
    SourceMutant(
        "dq_accum_index", "SM90 dQ reduce-add into the next m_block's dq_accum tile (cyclic)",
        (Edit("flash_bwd_sm90.py",
              "gdQaccum[(None, warp_group_idx), m_block_safe].iterator,\n",
              "gdQaccum[(None, warp_group_idx), m_block_min + (iter_idx + 1) % loop_count].iterator,\n"),),
        "bwd", ("dq_accum", "dq")),
    SourceMutant(
        "nondeterministic_dq", "SM90 deterministic dQ: semaphore acquire skipped (reduce order free)",
        (Edit("flash_bwd_sm90.py",
              "                        # Semaphore acquire: wait for prior n_blocks to finish writing this m_block\n"
              "                        if const_expr(self.deterministic):\n",
              "                        # Semaphore acquire: wait for prior n_blocks to finish writing this m_block\n"
              "                        if const_expr(False):  # mutant: acquire skipped\n"),),
        "bwd", ("dq",), determinism=True),
    # Twelve more from a red-team reading of FA4 4.0.0b36's SM90 paths (2026-12-04): the gradient
    # through the returned LSE, score_mod_bwd's indices, a head-dependent mask_mod under PackGQA,
    # the combine of empty rows, the varlen scheduler's head sections, the varlen backward's aux
    # index wrap, PackGQA's causal KV-block bound, unwritten dK/dV of empty query sequences, the
    # backward's left-window M-block bound and mask, the softcap derivative, a sink's empty row.
    SourceMutant(
        "bwd_dlse_sign_flipped",
        "backward preprocess: D' = D + dLSE instead of D - dLSE (gradient through the returned LSE "
        "enters with the wrong sign)",
        (Edit("flash_bwd_preprocess.py",
              "                            PdPsum_val -= gdLSE[row]\n",
              "                            PdPsum_val += gdLSE[row]\n"),),
        "bwd", ("D", "dq", "dk")),
    SourceMutant(
        "bwd_score_mod_bwd_indices_untransposed",
        "SM90 backward (SdP_swapAB, head dim <= 128): score_mod_bwd is handed q_idx and kv_idx swapped "
        "(the S-recompute score_mod keeps the transpose)",
        (Edit("flash_bwd_sm90.py",
              "            self.score_mod_bwd,\n"
              "            batch_idx,\n"
              "            head_idx,\n"
              "            softmax_scale,\n"
              "            self.vec_size,\n"
              "            self.qk_acc_dtype,\n"
              "            aux_data,\n"
              "            fastdiv_mods,\n"
              "            seqlen_info,\n"
              "            constant_q_idx=None,\n"
              "            qhead_per_kvhead=self.qhead_per_kvhead,\n"
              "            transpose_indices=self.SdP_swapAB,\n",
              "            self.score_mod_bwd,\n"
              "            batch_idx,\n"
              "            head_idx,\n"
              "            softmax_scale,\n"
              "            self.vec_size,\n"
              "            self.qk_acc_dtype,\n"
              "            aux_data,\n"
              "            fastdiv_mods,\n"
              "            seqlen_info,\n"
              "            constant_q_idx=None,\n"
              "            qhead_per_kvhead=self.qhead_per_kvhead,\n"
              "            transpose_indices=False,\n"),),
        "bwd", ("dq", "dk")),
    SourceMutant(
        "fwd_mask_mod_packgqa_head_stride",
        "SM90 forward with PackGQA: mask_mod is handed head kv_head + offset instead of "
        "kv_head * qhead_per_kvhead + offset (wrong query head for every KV head but the first)",
        (Edit("mask.py",
              "                    head_offset = global_row_idx % self.qhead_per_kvhead_packgqa\n"
              "                    head_idx_for_mod = head_idx * self.qhead_per_kvhead_packgqa + head_offset\n",
              "                    head_offset = global_row_idx % self.qhead_per_kvhead_packgqa\n"
              "                    head_idx_for_mod = head_idx + head_offset\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "combine_all_masked_lse_guard_dropped",
        "flash_attn_combine: the lse_max == -inf guard is dropped, so a row whose every split is empty "
        "gets LSE = NaN instead of -inf (O stays 0)",
        (Edit("flash_fwd_combine.py",
              "                    lse_max_cur = (\n"
              "                        0.0 if lse_max == -Float32.inf else lse_max\n"
              "                    )  # In case all local LSEs are -inf\n",
              "                    lse_max_cur = lse_max  # mutant: -inf guard dropped\n"),),
        "fwd", ("lse",)),
    SourceMutant(
        "varlen_l2_swizzle_tail_heads",
        "varlen tile scheduler (LPT / head-swizzle path): the last head section is assumed full "
        "(num_head % nheads_in_l2 == 0), so with more heads than one L2 section and a remainder, "
        "tail tiles map to heads >= num_head and some (m_block, head) tiles never run",
        (Edit("tile_scheduler.py",
              "                    nheads_in_this_section = (\n"
              "                        nheads_in_l2\n"
              "                        if nheads_in_l2 * (section_idx + 1) <= self.num_head\n"
              "                        else self.num_head - section_idx * nheads_in_l2\n"
              "                    )\n",
              "                    nheads_in_this_section = nheads_in_l2  # mutant: tail section assumed full\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "bwd_varlen_score_mod_q_wrap_by_seqlen_k",
        "SM90 backward, varlen Q with aux tensors: the per-sequence q_idx divisor for aux-tensor index "
        "wrapping is built from seqlen_k, so q_idx >= seqlen_k wraps and the S recompute reads the "
        "score_mod at the wrong query position",
        (Edit("flash_bwd_sm90.py",
              "                fastdiv_mods = (\n"
              "                    seqlen_q_divmod\n"
              "                    if not recompute_fastdiv_mods_q\n"
              "                    else FastDivmodDivisorV2(seqlen.seqlen_q),\n",
              "                fastdiv_mods = (\n"
              "                    seqlen_q_divmod\n"
              "                    if not recompute_fastdiv_mods_q\n"
              "                    else FastDivmodDivisorV2(seqlen.seqlen_k),\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "fwd_packgqa_nblock_max_floor",
        "SM90 forward, PackGQA with causal / right window: n_block_max from floor(m_idx_max / g) "
        "instead of ceil, so when g does not divide tile_m the last logical row of a tile can lose "
        "its diagonal key if that key opens a new KV tile",
        (Edit("block_info.py",
              "        if const_expr(self.is_causal or (self.is_local and self.window_size_right is not None)):\n"
              "            m_idx_max = (m_block + 1) * self.tile_m\n"
              "            if const_expr(self.qhead_per_kvhead_packgqa > 1):\n"
              "                m_idx_max = cute.ceil_div(m_idx_max, self.qhead_per_kvhead_packgqa)\n",
              "        if const_expr(self.is_causal or (self.is_local and self.window_size_right is not None)):\n"
              "            m_idx_max = (m_block + 1) * self.tile_m\n"
              "            if const_expr(self.qhead_per_kvhead_packgqa > 1):\n"
              "                m_idx_max = m_idx_max // self.qhead_per_kvhead_packgqa\n"),),
        "both", ("out", "lse")),
    SourceMutant(
        "bwd_varlen_empty_q_dkdv_not_zeroed",
        "SM90 backward, varlen Q (cu_seqlens_q / seqused_q), MHA, no window: a KV tile with no query "
        "block (an empty query sequence) skips the zero write, so dK/dV of its keys are left as "
        "torch.empty garbage",
        (Edit("flash_bwd_sm90.py",
              "                if const_expr(self.use_block_sparsity or self.is_local or self.is_varlen_q):\n",
              "                if const_expr(self.use_block_sparsity or self.is_local):\n"),),
        "bwd", ("dk", "dv")),
    SourceMutant(
        "bwd_mblock_max_local_left_off_by_one",
        "SM90 backward, left window: m_block_max from ceil((m_idx_left - 1) / tile_m), so when "
        "m_idx_left = 1 mod tile_m the one query row that sees a KV tile only at its window's left "
        "edge is skipped for that tile",
        (Edit("block_info.py",
              "            m_idx_left = m_idx + self.window_size_left\n",
              "            m_idx_left = m_idx + self.window_size_left - 1\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "softcap_bwd_derivative_dropped",
        "softcap backward: the tanh derivative 1 - tanh^2(s/c) is dropped (softcap treated as the "
        "identity in the backward)",
        (Edit("utils.py",
              "        return grad_out_SSA * (1.0 - tanh_scores * tanh_scores)\n",
              "        return grad_out_SSA  # mutant: tanh derivative dropped\n"),),
        "bwd", ("dq", "dk")),
    SourceMutant(
        "bwd_local_left_swapab_off_by_one",
        "SM90 backward local mask (SdP_swapAB path, head dim <= 128): admits one key past the "
        "window's left edge",
        (Edit("mask.py",
              "                            col0 - causal_row_offset + self.window_size_left\n",
              "                            col0 - causal_row_offset + self.window_size_left + 1\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "sink_fully_masked_row_guard_dropped",
        "forward finalize with a learnable sink: a fully masked row keeps row_max = -inf in the sink "
        "fold, so row_sum = inf and LSE = NaN (instead of the sink); the backward then sees NaN",
        (Edit("softmax.py",
              "                if row_max[r] == -Float32.inf:\n"
              "                    row_max_scaled = sink_val_cur * LOG2_E\n",
              "                pass  # mutant: fully-masked-row sink guard dropped\n"),),
        "both", ("lse", "dq", "dk", "dv")),
    # Note [Planted hang]: a kernel that never finishes on some problems only, so an audit shows
    # the deadline at work: the check running such a problem is `error: did not finish in N s`
    # naming the case, its worker killed; every other case and check keeps its verdict. The spin
    # is device code (a loop on the SM clock, a volatile read the compiler can neither hoist nor
    # drop), in the MMA warpgroups of the SM90 backward, compiled only for head dim 64 (a
    # compile-time branch: other head dims get the unchanged kernel).
    SourceMutant(
        "sm90_bwd_hd64_hang", "SM90 backward at head dim 64: the MMA warpgroups spin forever (kernel hang)",
        (Edit("flash_bwd_sm90.py",
              "            n_block, head_idx, batch_idx, _ = work_tile.tile_idx\n"
              "            seqlen = SeqlenInfoCls(batch_idx)\n\n"
              "            recompute_fastdiv_mods_q = const_expr(\n",
              "            n_block, head_idx, batch_idx, _ = work_tile.tile_idx\n"
              "            seqlen = SeqlenInfoCls(batch_idx)\n"
              "            if const_expr(self.tile_hdim == 64 and not self.check_hdim_oob):  # mutant: hang\n"
              "                spin_clock = cute.arch.clock64()\n"
              "                while spin_clock >= 0:\n"
              "                    spin_clock = cute.arch.clock64()\n\n"
              "            recompute_fastdiv_mods_q = const_expr(\n"),),
        "bwd", (), hang=True),
    # Eight more from a second red-team reading (2026-12-04, ninth session), each in a path no
    # plan row, edge or check reached: seqused_k with cu_seqlens_k, the LPT scheduler's L2
    # sections, the varlen scheduler's warp-scan batch groups, the public autograd backward
    # (softcap, dLSE), per-batch block-sparse lists, the varlen combine, paged KV without seqused_k.
    SourceMutant(
        "seqused_k_ignored_with_cu_seqlens_k",
        "SeqlenInfoQK: when cu_seqlens_k and seqused_k are both given, seqused_k is ignored and each "
        "sequence's seqlen_k is its full cu_seqlens_k length (precedence inverted)",
        (Edit("seqlen_info.py",
              "        if const_expr(mSeqUsedK is not None):\n"
              "            seqlen_k = mSeqUsedK[batch_idx]\n",
              "        if const_expr(mSeqUsedK is not None and mCuSeqlensK is None):\n"
              "            seqlen_k = mSeqUsedK[batch_idx]\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "fwd_lpt_l2_section_stride_dropped",
        "SM90 dense causal forward (SingleTileLPTScheduler): the L2 section index is not scaled by the "
        "section size (bidhb + residual instead of bidhb * swizzle + residual), so once batch*heads >= "
        "the swizzle some (batch, head) tiles run twice and others never",
        (Edit("tile_scheduler.py",
              "        bidhb_actual = bidhb * params.l2_minor + bidhb_residual\n"
              "        batch_idx, head_idx = divmod(bidhb_actual, params.num_head_divmod)\n"
              "        # Longest-processing-time-first\n",
              "        bidhb_actual = bidhb + bidhb_residual\n"
              "        batch_idx, head_idx = divmod(bidhb_actual, params.num_head_divmod)\n"
              "        # Longest-processing-time-first\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "varlen_scheduler_group_stride_off_by_one",
        "varlen tile scheduler (warp-scan batch search, <= 256 sequences): the next group of batches "
        "starts WARP_SIZE instead of WARP_SIZE - 1 later, so sequence 31 (62, ...) is never scheduled",
        (Edit("tile_scheduler.py",
              "                batch_idx += cute.arch.WARP_SIZE - 1\n",
              "                batch_idx += cute.arch.WARP_SIZE\n"),),
        "both", ("out", "lse", "D", "dq_accum", "dq", "dk", "dv")),
    SourceMutant(
        "autograd_bwd_softcap_dropped",
        "flash_attn_func autograd backward (FlashAttnFunc.backward) calls _flash_attn_bwd with softcap "
        "0.0 instead of ctx.softcap (the backward recomputes P without the tanh cap)",
        (Edit("interface.py",
              "                ctx.causal,\n"
              "                ctx.softcap,\n"
              "                window_size_left=ctx.window_size[0],\n"
              "                window_size_right=ctx.window_size[1],\n"
              "                deterministic=ctx.deterministic,\n",
              "                ctx.causal,\n"
              "                0.0,\n"
              "                window_size_left=ctx.window_size[0],\n"
              "                window_size_right=ctx.window_size[1],\n"
              "                deterministic=ctx.deterministic,\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "autograd_varlen_bwd_dlse_dropped",
        "flash_attn_varlen_func autograd backward (FlashAttnVarlenFunc.backward) does not forward dlse "
        "to _flash_attn_bwd: the gradient through the returned LSE (return_lse=True) is lost",
        (Edit("interface.py",
              "                aux_scalars=ctx.aux_scalars,\n"
              "                mask_mod=ctx.mask_mod,\n"
              "                dlse=dlse,\n",
              "                aux_scalars=ctx.aux_scalars,\n"
              "                mask_mod=ctx.mask_mod,\n"),),
        "bwd", ("dq", "dk")),
    SourceMutant(
        "bwd_preprocess_varlen_dlse_offset_dropped",
        "backward preprocess, varlen: D' = D - dLSE reads every sequence's dLSE from the first "
        "sequence's rows (the cu_seqlens offset of dLSE dropped); no stage is tapped on a varlen call "
        "and the public autograd path shares the fault, so only the dLSE pass's gradients can see it",
        (Edit("flash_bwd_preprocess.py",
              "                mdLSE_cur = seqlen.offset_batch(mdLSE, batch_idx, dim=2)[None, head_idx]\n",
              "                mdLSE_cur = (mdLSE if const_expr(seqlen.has_cu_seqlens)\n"
              "                             else seqlen.offset_batch(mdLSE, batch_idx, dim=2))[None, head_idx]\n"),),
        "bwd", ("dq", "dk")),
    # round 3 (a read-only helper, 2026-12-04): paths whose runtime condition no plan row reached;
    # each reached since by a constructed edge (Note [Constructed edges])
    SourceMutant(
        "bwd_varlen_k_cumsum_tile_m",
        "varlen backward above FA4's batch-lookup threshold: the K side's block-count lookup counts key "
        "blocks in tile_m units (copied from the Q side's call), so the varlen scheduler decodes later "
        "sequences against a wrong base",
        (Edit("interface.py",
              "            cu_seqlens=cu_seqlens_k,\n"
              "            seqused=seqused_k,\n"
              "            tile_size=n_block_size,\n",
              "            cu_seqlens=cu_seqlens_k,\n"
              "            seqused=seqused_k,\n"
              "            tile_size=m_block_size,\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "fwd_varlen_cumsum_packgqa_dropped",
        "varlen forward above FA4's batch-lookup threshold: the block-count lookup ignores GQA packing "
        "(pack_gqa not passed), so a sequence with more packed rows than tile_m shifts every later "
        "sequence's tiles",
        (Edit("interface.py",
              "            qhead_per_kvhead=qhead_per_kvhead,\n"
              "            pack_gqa=pack_gqa,\n"
              "        )\n"
              "    if blocks_to_batch_idx is None and USE_BLOCKS_TO_BATCH and cu_total_m_blocks is not None:\n",
              "            qhead_per_kvhead=qhead_per_kvhead,\n"
              "        )\n"
              "    if blocks_to_batch_idx is None and USE_BLOCKS_TO_BATCH and cu_total_m_blocks is not None:\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "fwd_packgqa_local_nblock_min_ceil",
        'PackGQA forward with a left window: the first logical row of a packed M block is rounded up (ceil_div, copied from the row-max bound), dropping the first key of its window where that key closes a KV tile',
        (Edit("block_info.py",
              "            m_idx_min = m_block * self.tile_m\n"
              "            if const_expr(self.qhead_per_kvhead_packgqa > 1):\n"
              "                m_idx_min = m_idx_min // self.qhead_per_kvhead_packgqa\n"
              "            n_idx = m_idx_min + seqlen_info.seqlen_k - seqlen_info.seqlen_q\n"
              "            n_idx_left = n_idx - self.window_size_left\n",
              "            m_idx_min = m_block * self.tile_m\n"
              "            if const_expr(self.qhead_per_kvhead_packgqa > 1):\n"
              "                m_idx_min = cute.ceil_div(m_idx_min, self.qhead_per_kvhead_packgqa)\n"
              "            n_idx = m_idx_min + seqlen_info.seqlen_k - seqlen_info.seqlen_q\n"
              "            n_idx_left = n_idx - self.window_size_left\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "bwd_lpt_section_stride_dropped",
        "deterministic dense backward: the LPT scheduler's L2 section index is not scaled by the section "
        "size (the backward twin of fwd_lpt_l2_section_stride_dropped), so with more (batch, head) pairs "
        "than one section some heads run twice and others never",
        (Edit("tile_scheduler.py",
              "        bidhb_actual = bidhb * params.l2_minor + bidhb_residual\n"
              "        batch_idx, head_idx = divmod(bidhb_actual, params.num_head_divmod)\n"
              "        if cutlass.const_expr(params.spt):\n",
              "        bidhb_actual = bidhb + bidhb_residual\n"
              "        batch_idx, head_idx = divmod(bidhb_actual, params.num_head_divmod)\n"
              "        if cutlass.const_expr(params.spt):\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "cu_blocks_chunk_carry_dropped",
        'varlen block-count lookup (CuSeqlensToBlocksKernel): the running total is not carried from one 1024-sequence chunk to the next, so a call with more sequences decodes the later ones against a wrong base',
        (Edit("cu_blocks_kernel.py",
              "            total_blocks_for_batch += base\n"
              "            total_split_blocks_for_batch += base_splits\n",
              "            total_split_blocks_for_batch += base_splits\n"),),
        "both", ("out", "lse", "dq")),
    SourceMutant(
        "fwd_lpt_sections_ignore_batch",
        'dense causal forward: the LPT scheduler counts its full L2 sections from the heads alone (batch left out), so with batch >= 2 and more (batch, head) pairs than one section most tiles map outside the problem',
        (Edit("tile_scheduler.py",
              "            num_hb_quotient = (args.num_head * args.num_batch) // swizzle\n"
              "            num_hb_remainder = (args.num_head * args.num_batch) % swizzle\n"
              "            return SingleTileLPTScheduler.Params(\n",
              "            num_hb_quotient = args.num_head // swizzle\n"
              "            num_hb_remainder = (args.num_head * args.num_batch) % swizzle\n"
              "            return SingleTileLPTScheduler.Params(\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "block_sparse_fwd_batch_index_dropped",
        "block-sparse forward (fixed-length): every batch entry reads batch 0's mask/full block lists "
        "(per-batch block masks collapse to the first sample's)",
        (Edit("block_sparse_utils.py",
              "    return _get_curr_blocksparse_tensors(batch_idx, head_idx, m_block, blocksparse_tensors)\n",
              "    return _get_curr_blocksparse_tensors(Int32(0), head_idx, m_block, blocksparse_tensors)\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "combine_varlen_out_offset_dropped",
        "flash_attn_combine with cu_seqlens: the merged O of every sequence is written from row 0 "
        "(cu_seqlens offset dropped in the output store)",
        (Edit("flash_fwd_combine.py",
              "                    mO_cur = cute.domain_offset((offset, 0, 0), mO)\n",
              "                    mO_cur = mO\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "paged_seqlen_k_static_page_size",
        "SM90 paged-KV forward without seqused_k: the static seqlen_k is the page size instead of "
        "page_size * pages_per_seq (only each sequence's first page is attended)",
        (Edit("flash_fwd_sm90.py",
              "            seqlen_k_static=mK.shape[0]\n"
              "            if const_expr(mPageTable is None)\n"
              "            else mK.shape[0] * mPageTable.shape[1],\n"
              "            mCuSeqlensQ=mCuSeqlensQ,\n",
              "            seqlen_k_static=mK.shape[0],\n"
              "            mCuSeqlensQ=mCuSeqlensQ,\n"),),
        "fwd", ("out", "lse")),
    # the fourth red-team round (docs/results/redteam4/analysis.md): runtime branches and shapes
    # no row, edge or check reached, each reached since by a constructed edge or a check's case
    SourceMutant(
        "fwd_causal_nblock_max_inclusive_row",
        "causal / right-window forward (unpacked): the KV-tile bound takes the M tile's last row as "
        "exclusive (m_idx_max one less), so where that row's rightmost key opens a KV tile "
        "(sk = sq + 1 at hd 128) the tile is skipped",
        (Edit("block_info.py",
              "        if const_expr(self.is_causal or (self.is_local and self.window_size_right is not None)):\n"
              "            m_idx_max = (m_block + 1) * self.tile_m\n",
              "        if const_expr(self.is_causal or (self.is_local and self.window_size_right is not None)):\n"
              "            m_idx_max = (m_block + 1) * self.tile_m - 1\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "bwd_causal_mblock_min_plus_one",
        "causal / right-window backward: the first M tile of a KV tile starts one row late (the mask's "
        "exclusive '1 +' copied into the inclusive row bound), so the M tile whose last row alone sees "
        "the KV tile's first key is skipped (sk = sq + 1 at hd 128)",
        (Edit("block_info.py",
              "            m_idx = n_idx_min + seqlen_info.seqlen_q - seqlen_info.seqlen_k\n",
              "            m_idx = n_idx_min + 1 + seqlen_info.seqlen_q - seqlen_info.seqlen_k\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "combine_o_partial_kblock_offset_dropped",
        "flash_attn_combine above head dim 128: every head-dim block of the partial O is read from "
        "column 0 (the k_block offset dropped), so columns 128.. merge columns 0..",
        (Edit("flash_fwd_combine.py",
              "                        mO_partial_cur, (tOmidx[m], k_block * self.k_block_size, 0, tOhidx[m])\n",
              "                        mO_partial_cur, (tOmidx[m], 0, 0, tOhidx[m])\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "combine_max_valid_split_first_slot",
        "flash_attn_combine with more than 32 splits: a thread's largest valid split is read from its "
        "first split slot only, so the splits past 32 are never accumulated",
        (Edit("flash_fwd_combine.py",
              "                            max_valid_idx = ts2rcLSE[0, s, 0][0]  # Get split coordinate\n",
              "                            max_valid_idx = ts2rcLSE[0, 0, 0][0]  # Get split coordinate\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "seqused_q_ignored_with_cu_seqlens_q",
        "packed Q with used lengths (cu_seqlens_q and seqused_q): the main kernels take the length from "
        "cu_seqlens_q, so a causal diagonal is aligned to the capacity",
        (Edit("seqlen_info.py",
              "        if const_expr(mSeqUsedQ is not None):\n"
              "            seqlen_q = mSeqUsedQ[batch_idx]\n"
              "        else:\n"
              "            seqlen_q = (\n",
              "        if const_expr(mSeqUsedQ is not None and mCuSeqlensQ is None):\n"
              "            seqlen_q = mSeqUsedQ[batch_idx]\n"
              "        else:\n"
              "            seqlen_q = (\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "block_sparse_packgqa_guard_dropped",
        "GQA forward with per-head block masks: PackGQA is kept, so each KV-head tile reads one query "
        "head's block lists for its whole group",
        (Edit("interface.py",
              "        if pack_gqa and block_sparse_tensors.mask_block_cnt.shape[head_dim_idx] != 1:\n"
              "            pack_gqa = False\n",
              ""),),
        "fwd", ("out", "lse")),
    # the fifth red-team round (docs/results/redteam5/analysis.md)
    SourceMutant(
        "autograd_varlen_bwd_seqused_k_dropped",
        "the varlen autograd backward (FlashAttnVarlenFunc.backward) does not hand seqused_k on: training "
        "through flash_attn_varlen_func recomputes P over every key up to the capacity",
        (Edit("interface.py",
              "                seqused_q=seqused_q,\n"
              "                seqused_k=seqused_k,\n"
              "                max_seqlen_q=ctx.max_seqlen_q,\n"
              "                max_seqlen_k=ctx.max_seqlen_k,\n"
              "                deterministic=ctx.deterministic,\n",
              "                seqused_q=seqused_q,\n"
              "                max_seqlen_q=ctx.max_seqlen_q,\n"
              "                max_seqlen_k=ctx.max_seqlen_k,\n"
              "                deterministic=ctx.deterministic,\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "autograd_bwd_block_sparse_dropped",
        "the autograd backward (FlashAttnFunc.backward) drops block_sparse_tensors_bwd: after a "
        "block-sparse forward the backward runs every KV tile",
        (Edit("interface.py",
              "                aux_scalars=ctx.aux_scalars,\n"
              "                block_sparse_tensors=ctx.block_sparse_tensors_bwd,\n"
              "                dlse=dlse,\n",
              "                aux_scalars=ctx.aux_scalars,\n"
              "                dlse=dlse,\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "sm90_paged_multi_tile_pages_take_tma",
        "SM90 paged KV: a page size that is a multiple of tile_n is routed to the TMA pager, which reads "
        "one KV tile per page (page 256 at hd 128 reads the wrong keys)",
        (Edit("interface.py",
              "                q_subtile_factor=q_subtile_factor,\n"
              "                paged_kv_non_tma=page_size not in [None, tile_n],\n"
              "            )\n",
              "                q_subtile_factor=q_subtile_factor,\n"
              "                paged_kv_non_tma=page_size is not None and page_size % tile_n != 0,\n"
              "            )\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "paged_page_offset_from_tile_row",
        "cp.async paged KV: the offset inside a page is taken from the row within the KV tile, exact "
        "only where the page size divides tile_n (page 48, or 256, reads other keys)",
        (Edit("paged_kv.py",
              "            page_idx, page_offset = divmod(row_idx + self.leftpad_k, self.page_size_divmod)\n",
              "            page_idx, _ = divmod(row_idx + self.leftpad_k, self.page_size_divmod)\n"
              "            _, page_offset = divmod(row + self.leftpad_k, self.page_size_divmod)\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "sm90_seqlen_mask_second_chunk",
        "SM90 seqlen-only mask (R2P): every 32-column chunk is masked as the first, so the 192 x 144 "
        "forward tile (hd 65..96, unmasked) keeps up to 16 keys past seqlen_k",
        (Edit("mask.py",
              "                    mask_r2p_lambda(acc_S_mn, lambda s: r2p_bitmask_below(seqlenk_col_limit_r2p, s))\n",
              "                    mask_r2p_lambda(acc_S_mn, lambda s: r2p_bitmask_below(seqlenk_col_limit_r2p, 0))\n"),),
        "fwd", ("out", "lse")),
    # the sixth red-team round (docs/results/redteam6/analysis.md): the SM90 backward
    SourceMutant(
        "sm90_bwd_lpt_sections_ignore_batch",
        "deterministic backward: the LPT scheduler counts its full L2 sections from the heads alone "
        "(batch left out), so with batch >= 2 and more (batch, head) pairs than one section most "
        "pairs are never computed",
        (Edit("tile_scheduler.py",
              "            num_hb_quotient = (args.num_head * args.num_batch) // swizzle\n"
              "            num_hb_remainder = (args.num_head * args.num_batch) % swizzle\n"
              "            num_block = cute.ceil_div(args.num_block, args.cluster_shape_mn[0])\n",
              "            num_hb_quotient = args.num_head // swizzle\n"
              "            num_hb_remainder = (args.num_head * args.num_batch) % swizzle\n"
              "            num_block = cute.ceil_div(args.num_block, args.cluster_shape_mn[0])\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "sm90_bwd_score_mod_bwd_offset_unswapped",
        "SM90 backward above head dim 128 (S not transposed): score_mod_bwd gets the query / key "
        "positions offset by the transposed tile's sizes",
        (_sm90_bwd_offset_unswapped("apply_score_mod_bwd_inner"),),
        "bwd", ("dq", "dk")),
    SourceMutant(
        "sm90_bwd_score_mod_offset_unswapped",
        "SM90 backward above head dim 128 (S not transposed): the recompute of S applies the score_mod "
        "at the transposed tile's positions",
        (_sm90_bwd_offset_unswapped("apply_score_mod_inner"),),
        "bwd", ("dq", "dk", "dv")),
    # the seventh red-team round (the SM90 forward, docs/results/redteam7/)
    SourceMutant(
        "sm90_fwd_score_mod_unpacked_gqa_indices",
        "SM90 forward with a score_mod on unpacked GQA (pack_gqa=False): the mod gets packed rows and heads",
        (Edit("flash_fwd_sm90.py",
              "            constant_q_idx=None,\n"
              "            qhead_per_kvhead=self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,\n"
              "        )\n",
              "            constant_q_idx=None,\n"
              "            qhead_per_kvhead=self.qhead_per_kvhead,\n"
              "        )\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "packgqa_q_ptr_second_wave_dropped",
        "PackGQA's cp.async Q load: a thread's second row pointer (tile_m 192, a ratio not dividing it) "
        "points at its first row",
        (Edit("pack_gqa.py",
              "            row = i * num_threads + cRows[tidx % threads_per_row][0]\n",
              "            row = cRows[tidx % threads_per_row][0]\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "sm90_fwd_q_subtile_factor_dropped",
        "SM90 block-sparse forward: q_subtile_factor is not passed, so a Q block of two forward tiles is "
        "read as two blocks",
        (Edit("interface.py",
              "                has_aux_tensors=aux_tensors is not None,\n"
              "                q_subtile_factor=q_subtile_factor,\n"
              "                paged_kv_non_tma=page_size not in [None, tile_n],\n",
              "                has_aux_tensors=aux_tensors is not None,\n"
              "                paged_kv_non_tma=page_size not in [None, tile_n],\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "paged_aux_kv_divisor_page_size",
        "paged KV without seqused_k and an aux-tensor mod pair: the kv index a mod sees wraps at the page size",
        (Edit("utils.py",
              "        if const_expr(mPageTable is None)\n"
              "        else mK.shape[0] * mPageTable.shape[1]\n"
              "    )\n"
              "    return (FastDivmodDivisorV2(seqlen_q), FastDivmodDivisorV2(seqlen_k))\n",
              "        if const_expr(mPageTable is None)\n"
              "        else mK.shape[0]\n"
              "    )\n"
              "    return (FastDivmodDivisorV2(seqlen_q), FastDivmodDivisorV2(seqlen_k))\n"),),
        "fwd", ("out", "lse")),
    # the eighth red-team round (host routing, docs/results/redteam8/)
    SourceMutant(
        "bwd_varlen_q_cumsum_tile_n",
        "varlen backward with > 256 sequences: the Q side's batch-lookup hint counted in KV tiles",
        (Edit("interface.py",
              "            cu_seqlens=cu_seqlens_q,\n            seqused=seqused_q,\n            tile_size=m_block_size,\n"
              "        )\n",
              "            cu_seqlens=cu_seqlens_q,\n            seqused=seqused_q,\n            tile_size=n_block_size,\n"
              "        )\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "callable_hash_defaults_dropped",
        "the mods' compile-key hash ignores default-argument constants (two mods differing only there "
        "share a kernel)",
        (Edit("utils.py",
              "    for attr in (\"__defaults__\", \"__kwdefaults__\"):\n"
              "        values = getattr(func, attr, None)\n"
              "        if values is not None:\n"
              "            hasher.update(attr.encode())\n"
              "            hasher.update(repr(values).encode())\n",
              ""),),
        "both", ("out", "lse")),
    # its quieter sibling: the branch and its text kept, the values not hashed (a reading of
    # utils.py's text still sees "__defaults__"; the constructed call pair decides it)
    SourceMutant(
        "callable_hash_default_values_dropped",
        "the mods' compile-key hash names the defaults but not their values (two mods differing only "
        "in a default-argument constant share a kernel)",
        (Edit("utils.py",
              "            hasher.update(attr.encode())\n"
              "            hasher.update(repr(values).encode())\n",
              "            hasher.update(attr.encode())\n"),),
        "both", ("out", "lse")),
    SourceMutant(
        "autograd_lse_only_dout_uninitialised",
        "the public autograd backward of a loss through the LSE alone reads an uninitialised dO",
        (Edit("interface.py",
              "        q, k, v, qv, out, lse, p, row_max, o_lo, gather_kv_indices, learnable_sink, *aux = "
              "ctx.saved_tensors\n"
              "        aux_tensors = aux if aux else None\n        if not ctx.return_lse:\n            dlse = None\n"
              "        if dout is None:\n            dout = torch.zeros_like(out)\n",
              "        q, k, v, qv, out, lse, p, row_max, o_lo, gather_kv_indices, learnable_sink, *aux = "
              "ctx.saved_tensors\n"
              "        aux_tensors = aux if aux else None\n        if not ctx.return_lse:\n            dlse = None\n"
              "        if dout is None:\n            dout = torch.empty_like(out)\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "window_half_negative_means_none",
        "a window with one negative side is taken as no window",
        (Edit("interface.py",
              "            and window_size_left < 0 and window_size_right < 0):\n",
              "            and (window_size_left < 0 or window_size_right < 0)):\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    # the ninth red-team round (the SM90 softmax, sinks and deterministic dQ, docs/results/redteam9/)
    SourceMutant(
        "causal_loop_check_inf_local_only",
        "the SM90 forward's causal masking loop keeps the -inf guard of the running max for local "
        "windows only: rows that met no key yet turn NaN (tall tiles, unpacked causal calls)",
        (Edit("flash_fwd_sm90.py",
              "                            mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),\n"
              "                        )\n"
              "                        O_should_accumulate = True\n"
              "                    n_block_max = cutlass.min(n_block_max, n_block_min_causal_local_mask)\n",
              "                            mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),\n"
              "                            check_inf=self.is_local,\n"
              "                        )\n"
              "                        O_should_accumulate = True\n"
              "                    n_block_max = cutlass.min(n_block_max, n_block_min_causal_local_mask)\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "det_dq_release_on_smem_read",
        "the SM90 deterministic backward releases the dQ semaphore once its reduce-add has read "
        "shared memory, not once the global add is done (dQ no longer bitwise reproducible)",
        (Edit("flash_bwd_sm90.py",
              "        read_flag = const_expr(not self.deterministic)\n",
              "        read_flag = const_expr(self.deterministic)\n"),),
        "bwd", ("dq",), determinism=True),
    SourceMutant(
        "dsink_empty_row_guard_sign",
        "dsink of a row with no key tests LSE == +inf for its empty-row guard (a sink of -inf gives NaN)",
        (Edit("flash_bwd_postprocess.py", "        if lse_val == -Float32.inf\n", "        if lse_val == Float32.inf\n"),),
        "bwd", ("dsink",)),
    SourceMutant(
        "running_max_stored_after_inf_guard",
        "the online softmax stores the running max after its -inf -> 0 guard: a row fully masked in "
        "its first KV tile starts from 0, and on scores far below 0 every later P flushes to 0",
        (Edit("softmax.py",
              "            row_max_prev = row_max[r]\n"
              "            row_max[r] = row_max_cur\n"
              "\n"
              "            if cutlass.const_expr(check_inf):\n"
              "                row_max_cur = 0.0 if row_max_cur == -Float32.inf else row_max_cur\n",
              "            row_max_prev = row_max[r]\n"
              "\n"
              "            if cutlass.const_expr(check_inf):\n"
              "                row_max_cur = 0.0 if row_max_cur == -Float32.inf else row_max_cur\n"
              "            row_max[r] = row_max_cur\n"),),
        "fwd", ("out", "lse")),
    # the tenth red-team round (the SM90 masks and block sparsity, docs/results/redteam10/)
    SourceMutant(
        "mask_mod_aux_kv_wrap_by_seqlen_q",
        "a mask_mod's aux key index wraps at seqlen_q, not seqlen_k (keys past seqlen_q read another entry)",
        (Edit("mask.py",
              "                        _, col_for_mod = divmod(global_col_idx, fastdiv_mods[1])\n",
              "                        _, col_for_mod = divmod(global_col_idx, fastdiv_mods[0])\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "mask_mod_aux_q_wrap_by_seqlen_k",
        "a mask_mod's aux query index wraps at seqlen_k, not seqlen_q (rows past seqlen_k read another entry)",
        (Edit("mask.py",
              "                    _, row_for_mod = divmod(row_for_mod, fastdiv_mods[0])\n",
              "                    _, row_for_mod = divmod(row_for_mod, fastdiv_mods[1])\n"),),
        "both", ("out", "lse", "dq", "dk", "dv")),
    SourceMutant(
        "varlen_sparse_mask_cnt_local_m_block",
        "varlen block sparsity: a sequence's Q block reads the mask-block count of the first sequence's block",
        (Edit("block_sparse_utils.py",
              "    curr_mask_block_cnt = mask_block_cnt[head_idx, curr_m_block]\n",
              "    curr_mask_block_cnt = mask_block_cnt[head_idx, m_block]\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "varlen_sparse_mask_idx_batch_offset",
        "varlen block sparsity: every Q block of a sequence reads its first Q block's mask-block indices",
        (Edit("block_sparse_utils.py",
              "    curr_mask_block_idx = cute.domain_offset(curr_block_idx_offset, mask_block_idx[head_idx, None])\n",
              "    curr_mask_block_idx = cute.domain_offset(batch_block_idx_offset, mask_block_idx[head_idx, None])\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "block_sparse_broadcast_not_keyed",
        "the block tensors' broadcast (stride-0) pattern left out of the forward's compile key (measured "
        "on an H100, 2026-12-06: the reused kernel reads the lists' strides at run time, no value changes)",
        (Edit("interface.py",
              "        use_block_sparsity,\n        block_sparse_broadcast_pattern,\n        tensor_broadcast_patterns,\n"
              "        aux_tensor_metadata,\n",
              "        use_block_sparsity,\n        tensor_broadcast_patterns,\n        aux_tensor_metadata,\n"),),
        "fwd", ("out", "lse")),
    # the eleventh red-team round (SM90 stores, loads, schedulers, paged pools: docs/results/redteam11/)
    SourceMutant(
        "paged_cpasync_page_address_from_row_index",
        "cp.async paged KV: a page's address taken as row page * page_size + offset of the pool (right "
        "for a compact pool only: a pool with a larger page stride reads other pages)",
        (Edit("paged_kv.py",
              "                tPrXPtr[i] = utils.elem_pointer(mX, (page_offset, d_offset, page)).toint()\n",
              "                tPrXPtr[i] = utils.elem_pointer(\n"
              "                    mX, (page_offset + page * mX.shape[0], d_offset, 0)\n"
              "                ).toint()\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "varlen_lpt_block_order_dropped",
        "varlen tile scheduler: the longest-first block order dropped; the deterministic varlen causal "
        "backward's dQ semaphores deadlock once a sequence's KV-block chain outgrows one wave of CTAs",
        (Edit("tile_scheduler.py",
              "                if const_expr(self.lpt):\n"
              "                    block = num_m_blocks - 1 - block\n",
              ""),),
        "bwd", (), hang=True),
    SourceMutant(
        "packgqa_o_store_hdim_pred_from_q",
        "SM90 forward, cp.async PackGQA O store: the head-dim predicate is Q's, not V's (with head_dim_v "
        "padded and head_dim not, O's padded columns overwrite the next row's first columns)",
        (Edit("flash_fwd.py",
              "            self.tile_m, self.tile_hdimv, self.check_hdim_v_oob, self.qhead_per_kvhead\n",
              "            self.tile_m, self.tile_hdimv, self.check_hdim_oob, self.qhead_per_kvhead\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "bwd_preprocess_hdim_v_pred_from_hd",
        "backward preprocess: the O / dO head-dim predicate decided by head_dim, not head_dim_v (D sums "
        "columns past head_dim_v when only head_dim_v is padded)",
        (Edit("flash_bwd_preprocess.py",
              "        self.check_hdim_v_oob = head_dim_v != self.head_dim_v_padded\n",
              "        self.check_hdim_v_oob = head_dim != self.head_dim_padded\n"),),
        "bwd", ("dq", "dk")),
    # the twelfth red-team round (faults inside configurations a known issue absorbs:
    # docs/results/redteam12/); expected missed until the known issues absorb only their defect
    SourceMutant(
        "sm90_bwd_accum_round64_widened",
        "SM90 backward accumulators read with head dims rounded to 64 (the known dQ rounding defect "
        "widened to hd 24/32/88/96; the known issue's predictor reads the same line)",
        (Edit("interface.py",
              "hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 32",
              "hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 64"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "score_mod_bwd_gqa_head_unscaled",
        "score_mod_bwd under GQA gets the KV head plus the offset, not the query head",
        (Edit("softmax.py",   # the backward's copy of the mapping (apply_score_mod_bwd_inner)
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
              "                head_idx_vec[j] = head_idx + head_offset"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        "bwd_mask_mod_dropped_under_causal",
        "the backward drops a mask_mod passed with causal=True (keeps the causal mask only); an equivalent "
        "mutant of 4.0.0b36, whose element mask already applies causal alone when both are set (mask.py "
        "apply_mask: the mask_mod branch only without causal or local): no value can show it",
        (Edit("interface.py",
              "    causal, local, window_size_left, window_size_right = _resolve_causal_local_window(\n"
              "        causal, window_size_left, window_size_right\n    )\n\n    if arch // 10 == 12:\n",
              "    causal, local, window_size_left, window_size_right = _resolve_causal_local_window(\n"
              "        causal, window_size_left, window_size_right\n    )\n    if causal:\n        mask_mod = None\n\n"
              "    if arch // 10 == 12:\n"),),
        "bwd", ("dq", "dk", "dv")),
    SourceMutant(
        'sm90_bwd_hd64_causal_mha_nondet_dk_scale',
        "dK scaled by 1 + 2^-7 in the SM90 MHA backward at tile_hdim <= 64, causal, without deterministic (FA4's default hd-64 training call; red-team round 13: no audit call compiled that variant)",
        (Edit('flash_bwd_sm90.py',
              '                    acc_dK.store(acc_dK.load() * softmax_scale)',
              '                    acc_dK.store(acc_dK.load() * (softmax_scale * 1.0078125 if const_expr(self.tile_hdim <= 64 and self.is_causal and self.qhead_per_kvhead == 1 and not self.deterministic) else softmax_scale))'),),
        'bwd', ('dk',)),
    SourceMutant(
        'sm90_bwd_hd256_mha_nondet_dk_scale',
        'dK scaled by 1 + 2^-7 in the SM90 MHA backward at hd 256 without deterministic (round 13: unreached variant)',
        (Edit('flash_bwd_sm90.py',
              '                    acc_dK.store(acc_dK.load() * softmax_scale)',
              '                    acc_dK.store(acc_dK.load() * (softmax_scale * 1.0078125 if const_expr(self.tile_hdim == 256 and self.qhead_per_kvhead == 1 and not self.deterministic) else softmax_scale))'),),
        'bwd', ('dk',)),
    SourceMutant(
        'sm90_bwd_hd96_causal_mha_dk_scale',
        'dK scaled by 1 + 2^-7 in the SM90 causal MHA backward with one dQ warpgroup (hd 65-96; round 13: unreached variant)',
        (Edit('flash_bwd_sm90.py',
              '                    acc_dK.store(acc_dK.load() * softmax_scale)',
              '                    acc_dK.store(acc_dK.load() * (softmax_scale * 1.0078125 if const_expr(self.num_wg_dQ == 1 and self.is_causal and self.qhead_per_kvhead == 1) else softmax_scale))'),),
        'bwd', ('dk',)),
    SourceMutant(
        'sm90_fwd_hd192_hdv128_packgqa_scale',
        'the softmax scale off by 1 + 2^-7 in the SM90 PackGQA forward at hd 192 / hdv 128 on the 128 x 128 tile (round 13: unreached variant)',
        (Edit('flash_fwd_sm90.py',
              '        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n            softmax_scale, self.score_mod\n        )',
              '        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n            softmax_scale * (1.0078125 if (self.pack_gqa and self.tile_hdim == 192 and self.tile_hdimv == 128 and self.tile_n == 128) else 1.0), self.score_mod\n        )'),),
        'fwd', ('out', 'lse')),
    SourceMutant(
        'sm90_fwd_tile_m64_causal_scale',
        'the softmax scale off by 1 + 2^-7 in the SM90 forward with one MMA warpgroup (tile_m 64: 64-row sparse Q '
        'blocks) under a causal or local mask (round 13 F46: a variant no audit call compiled before block lists '
        'took causal / windows)',
        (Edit('flash_fwd_sm90.py',
              '        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n            softmax_scale, self.score_mod\n        )',
              '        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(\n            softmax_scale * (1.0078125 if (self.tile_m == 64 and (self.is_causal or self.is_local)) else 1.0), self.score_mod\n        )'),),
        'fwd', ('out', 'lse')),
    SourceMutant(
        'sm90_bwd_sparse_local_mha_dk_scale',
        'dK scaled by 1 + 2^-7 in the SM90 MHA block-sparse backward under a window (the kernels known issue '
        'sm90_sparse_bwd_left_window_unwritten lives in: its rule must take none of this fault, which reaches '
        'every written key; the statistical tier judges no such call, the twin refusing block lists under a window)',
        (Edit('flash_bwd_sm90.py',
              '                    acc_dK.store(acc_dK.load() * softmax_scale)',
              '                    acc_dK.store(acc_dK.load() * (softmax_scale * 1.0078125 if const_expr(self.use_block_sparsity and self.is_local and self.qhead_per_kvhead == 1) else softmax_scale))'),),
        'bwd', ('dk',)),
    SourceMutant(
        'dsink_empty_row_zero',
        "dsink's row term takes P_sink = 0 instead of 1 on a row whose LSE is -inf (a row no key reaches, "
        "under a sink of -inf); with a finite sink LSE >= sink and the branch never runs (red-team round 16 #7)",
        (Edit('flash_bwd_postprocess.py',
              '        Float32(1.0)\n        if lse_val == -Float32.inf',
              '        Float32(0.0)\n        if lse_val == -Float32.inf'),),
        'bwd', ('dsink',)),
)


def catalogue(ids: Optional[Iterable[str]] = None) -> list[SourceMutant]:
    """The catalogue, or the named mutants (KeyError naming unknown ids)."""
    if ids is None:
        return list(CATALOGUE)
    by = {m.id: m for m in CATALOGUE}
    want = list(ids)
    bad = [i for i in want if i not in by]
    if bad:
        raise KeyError(f"unknown source mutant(s) {bad}; have {sorted(by)}")
    return [by[i] for i in want]


def installed_root() -> Path:
    """The installed ``flash_attn`` package directory (found without importing it)."""
    import importlib.util
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("flash_attn is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def source_digest(root: Path) -> str:
    """sha256 over (relative path, bytes) of every file under ``root`` except ``__pycache__``."""
    h = hashlib.sha256()
    for p in _files(root):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def apply_edits(text: str, edits: Sequence[Edit], file: str) -> str:
    """``text`` with every edit of ``file`` applied; each ``old`` must occur exactly once in the
    original text (and still once when its turn comes)."""
    for e in edits:
        if e.file != file:
            continue
        n = text.count(e.old)
        if n != 1:
            raise EditError(f"{file}: edit expected to match exactly once, matched {n} times: "
                            f"{e.old.strip()[:80]!r}")
        text = text.replace(e.old, e.new, 1)
    return text


@dataclasses.dataclass(frozen=True)
class PrivateCopy:
    """A patched copy: ``path`` goes first on PYTHONPATH; ``fingerprint`` names it."""

    mutant: Optional[SourceMutant]
    path: Path
    fingerprint: str
    original_digest: str


def make_copy(mutant: Optional[SourceMutant], dest: Path, *, source: Optional[Path] = None) -> PrivateCopy:
    """Copy the installed ``flash_attn`` (or ``source``) to ``dest/flash_attn`` and apply
    ``mutant`` (None: a clean copy, the control). Raises :class:`EditError` when an edit does
    not apply exactly once; the source tree is only read."""
    src = Path(source) if source is not None else installed_root()
    orig = source_digest(src)
    dest = Path(dest)
    pkg = dest / "flash_attn"
    if pkg.exists():
        shutil.rmtree(pkg)
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    h = hashlib.sha256(orig.encode())
    if mutant is not None:
        files = sorted({e.file for e in mutant.edits})
        for f in files:
            p = pkg / "cute" / f
            if not p.is_file():
                raise EditError(f"{mutant.id}: flash_attn/cute/{f} does not exist in {src}")
            p.write_text(apply_edits(p.read_text(), mutant.edits, f))
        h.update(json.dumps(mutant.to_dict(), sort_keys=True).encode())
    fp = h.hexdigest()
    (dest / "FINGERPRINT").write_text(json.dumps(
        {"fingerprint": fp, "original_sha256": orig, "source": str(src),
         "mutant": mutant.to_dict() if mutant else None}, indent=2))
    return PrivateCopy(mutant, dest, fp, orig)


def worker_env(copy: PrivateCopy, cache_root: Path) -> dict[str, str]:
    """The worker's environment: the copy first on PYTHONPATH, FA4's compile cache keyed by the
    fingerprint (the unpatched kernel can never be served)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy.path)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(Path(cache_root) / copy.fingerprint[:16])
    env["FA4VERIFY_PRIVATE_FA4"] = str(copy.path)
    return env
