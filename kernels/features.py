"""FA4's public feature surface by arch and direction, as data read from FA4's own source.

Every cell of :data:`SUPPORT` says whether flash-attn-4 4.0.0b36 runs a feature on a kernel
family (``sm90`` = SM 9.x; ``sm100`` = SM 10.x/11.x, the family ``interface.py`` tests with
``arch // 10 in [10, 11]``) in one direction (``fwd`` / ``bwd``), and names the evidence in FA4's
source that says so: a line of ``flash_attn/cute/interface.py`` (or another FA4 file), or the
presence/absence of a parameter in an FA4 function's signature. :func:`check_evidence` re-reads
the installed source and returns, per cell, the line number of its quote (or the signature
finding), so a new FA4 release that moves or drops a rule fails ``tests/test_features_table.py``
instead of leaving a stale table.

The statuses are FA4's *claims* (what the interface accepts and dispatches), not fa4verify's
measurements; ``fa4verify.tables.features`` joins them with the evidence fa4verify holds (measured
on a GPU, compile-only, CPU twin) for the README's feature x arch table.

Possible issues
---------------
"supported" means the interface dispatches the call to a kernel for that family without an
assertion; it does not mean every combination (head dims, GQA, varlen) compiles there. The
qualifiers (``note``) give the restrictions interface.py states for the feature itself.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

__all__ = ["Evidence", "Cell", "FEATURES", "ARCHS", "DIRECTIONS", "SUPPORT", "cell", "fa4_source",
           "check_evidence", "EvidenceError", "sm90_sparse_bwd_does_not_build"]

Status = Literal["supported", "not supported", "n/a"]
ARCHS: tuple[str, ...] = ("sm90", "sm100")
DIRECTIONS: tuple[str, ...] = ("fwd", "bwd")

#: feature key -> human label (row order of the README table)
FEATURES: dict[str, str] = {
    "score_mod": "score_mod / mask_mod (+ aux tensors)",
    "block_sparse": "block sparsity (`block_sparse_tensors`)",
    "paged_kv": "paged KV (`page_table`, + `seqused_k`)",
    "seqused": "`seqused_q` / `seqused_k`",
    "split_kv": "split-KV (`num_splits` > 1, internal combine)",
    "combine": "`flash_attn_combine` (public combine)",
    "fp8": "fp8 e4m3 + `q/k/v_descale`",
    "mla": "MLA (`qv`)",
    "gather": "top-k gather (`gather_kv_indices`)",
}


@dataclass(frozen=True)
class Evidence:
    """Where FA4's source says it. ``kind``:

    * ``"quote"``: ``text`` occurs verbatim (after collapsing runs of whitespace) in ``file``
      (relative to the ``flash_attn/cute`` package);
    * ``"param"``: function ``func`` of ``interface.py`` has (``present=True``) or lacks
      (``present=False``) the parameter ``text``.
    """
    kind: Literal["quote", "param"]
    text: str
    file: str = "interface.py"
    func: str = ""
    present: bool = True


@dataclass(frozen=True)
class Cell:
    feature: str
    arch: str
    direction: str
    status: Status
    evidence: tuple[Evidence, ...]
    note: str = ""


def _q(text: str, file: str = "interface.py") -> Evidence:
    return Evidence("quote", text, file)


def _p(func: str, name: str, present: bool = True) -> Evidence:
    return Evidence("param", name, func=func, present=present)


_SM8_SCORE_MOD = _q('raise NotImplementedError("Custom user-provided score_mod is not supported on SM8x architectures.")')
_FWD_SCORE = _p("_flash_attn_fwd", "score_mod")
_BWD_SCORE = _q('assert score_mod_bwd is not None, "score_mod_bwd is required when score_mod is provided"')
_BS_VARLEN_BWD = _q('), "Varlen backward with block sparsity is not yet supported"')
_SPLIT_SM90 = _q('assert not is_split_kv, "SplitKV not supported on SM 9.0"')
_FP8_ARCH = _q('assert arch // 10 == 10, "FP8 is only supported on SM100 (compute capability 10.x) for FA4 CuTe."')
_FP8_BWD = _q('raise NotImplementedError("FA4 CuTe FP8 backward is not supported yet (forward-only).")')
_QV_ARCH = _q('assert arch // 10 in [10, 11], "only support Blackwell arch with qv"')
_GATHER_QV = _q('assert gather_kv_indices is None, "gather_kv_indices is only supported with qv"')
_MLA_BWD = _q('assert gather_kv_indices is not None, "require gather kv indices for backward"')
_MLA_BWD_ARCH = _q('assert arch // 10 in [10, 11], "Unsupported compute capability. Supported: 10.x, 11.x"')
_PAGED_NON_TMA = _q("paged_kv_non_tma=page_size not in [None, tile_n],")
_PAGED_BWD = _p("_flash_attn_bwd", "page_table", present=False)
_PAGED_VARLEN = _q('assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"')
_COMBINE_DEF = _q("def flash_attn_combine(")
_COMBINE_KEY = _q("_get_device_arch() if _arch is None else _arch,")


def _cells() -> tuple[Cell, ...]:
    S, N, NA = "supported", "not supported", "n/a"
    c = []

    def add(feature, arch, direction, status, evidence, note=""):
        c.append(Cell(feature, arch, direction, status, tuple(evidence), note))

    for arch in ARCHS:
        add("score_mod", arch, "fwd", S, [_FWD_SCORE, _SM8_SCORE_MOD], "only SM8x rejects a user score_mod")
        add("score_mod", arch, "bwd", S, [_BWD_SCORE, _SM8_SCORE_MOD], "needs score_mod_bwd")
        add("block_sparse", arch, "fwd", S, [_p("_flash_attn_fwd", "block_sparse_tensors"),
                                              _q('assert not use_block_sparsity, "Block sparsity not supported on SM 12.0"')],
            "only SM 12.0 rejects it")
        add("block_sparse", arch, "bwd", S, [_p("_flash_attn_bwd", "block_sparse_tensors"), _BS_VARLEN_BWD],
            "not varlen")
        add("paged_kv", arch, "fwd", S, [_PAGED_NON_TMA, _PAGED_VARLEN],
            "batched K/V pages only (not with cu_seqlens_k); TMA loads when page_size == tile_n")
        add("paged_kv", arch, "bwd", N, [_PAGED_BWD])
        add("seqused", arch, "fwd", S, [_p("_flash_attn_fwd", "seqused_k")])
        add("seqused", arch, "bwd", S, [_p("_flash_attn_bwd", "seqused_k"), _BS_VARLEN_BWD],
            "not with block sparsity")
        add("combine", arch, "bwd", NA, [_COMBINE_DEF], "inference-only kernel")
        add("split_kv", arch, "bwd", NA, [_p("_flash_attn_bwd", "num_splits", present=False)],
            "forward-only")
    add("split_kv", "sm90", "fwd", N, [_SPLIT_SM90])
    add("split_kv", "sm100", "fwd", S, [_q("is_split_kv=is_split_kv,"), _SPLIT_SM90],
        "SM 10.x/11.x only")
    # the combine kernel is arch-generic: its compile key carries the arch but no arch assert
    add("combine", "sm90", "fwd", S, [_COMBINE_DEF, _COMBINE_KEY],
        "arch-generic kernel (cp.async, warp reductions); no arch assertion")
    add("combine", "sm100", "fwd", S, [_COMBINE_DEF, _COMBINE_KEY], "also the split-KV path's second stage")
    add("fp8", "sm90", "fwd", N, [_FP8_ARCH])
    add("fp8", "sm90", "bwd", N, [_FP8_BWD])
    add("fp8", "sm100", "fwd", S, [_FP8_ARCH], "SM 10.x only (SM 11.x rejected)")
    add("fp8", "sm100", "bwd", N, [_FP8_BWD])
    add("mla", "sm90", "fwd", N, [_QV_ARCH])
    add("mla", "sm90", "bwd", N, [_QV_ARCH, _MLA_BWD_ARCH])
    add("mla", "sm100", "fwd", S, [_QV_ARCH], "head_dim 64 + head_dim_v 512, no local window")
    add("mla", "sm100", "bwd", S, [_MLA_BWD, _MLA_BWD_ARCH], "sparse (gather) MLA only")
    add("gather", "sm90", "fwd", N, [_GATHER_QV, _QV_ARCH], "needs qv (MLA)")
    add("gather", "sm90", "bwd", N, [_MLA_BWD_ARCH])
    add("gather", "sm100", "fwd", S, [_GATHER_QV, _QV_ARCH], "with qv (MLA) only")
    add("gather", "sm100", "bwd", S, [_MLA_BWD, _MLA_BWD_ARCH], "sparse MLA backward")
    return tuple(c)


SUPPORT: tuple[Cell, ...] = _cells()


def cell(feature: str, arch: str, direction: str) -> Cell:
    """The cell of ``feature`` x ``arch`` x ``direction`` (KeyError if absent)."""
    for c in SUPPORT:
        if (c.feature, c.arch, c.direction) == (feature, arch, direction):
            return c
    raise KeyError((feature, arch, direction))


class EvidenceError(AssertionError):
    """A cell's evidence is not in the installed FA4 source."""


def fa4_source(file: str = "interface.py") -> str:
    """Text of an installed ``flash_attn/cute`` file (FileNotFoundError / ImportError if FA4 is
    not installed)."""
    import importlib.util
    spec = importlib.util.find_spec("flash_attn.cute")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("flash_attn.cute is not installed")
    return (Path(list(spec.submodule_search_locations)[0]) / file).read_text()


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def check_evidence(c: Cell, sources: Optional[dict[str, str]] = None,
                   signature_of=None) -> list[str]:
    """Where each piece of ``c``'s evidence is in FA4's source: ``"interface.py:<line>"`` for a
    quote, ``"<func>(... <name> ...)"`` / ``"<func> has no <name>"`` for a signature finding.
    Raises :class:`EvidenceError` naming the first piece that is not there. ``sources`` (file ->
    text) and ``signature_of`` (func name -> parameter names) replace the installed FA4 (tests)."""
    sources = {} if sources is None else sources
    out = []
    for e in c.evidence:
        if e.kind == "quote":
            if e.file not in sources:
                sources[e.file] = fa4_source(e.file)
            text = sources[e.file]
            want = _squash(e.text)
            lines = text.splitlines()
            line = None
            for i, ln in enumerate(lines):
                if want in _squash(ln) or (want in _squash(" ".join(lines[i:i + 3]))
                                           and want[:20] in _squash(ln)):
                    line = i + 1
                    break
            if line is None:
                raise EvidenceError(f"{c.feature}/{c.arch}/{c.direction}: {e.file} does not contain {e.text!r}")
            out.append(f"{e.file}:{line}")
        else:
            if signature_of is not None:
                names = signature_of(e.func)
            else:
                from fa4verify.kernels.adapter import interface_module   # FA4's one importer
                names = list(inspect.signature(getattr(interface_module(), e.func)).parameters)
            if (e.text in names) != e.present:
                raise EvidenceError(f"{c.feature}/{c.arch}/{c.direction}: {e.func} "
                                    f"{'lacks' if e.present else 'has'} parameter {e.text!r}")
            out.append(f"{e.func}({e.text})" if e.present else f"{e.func} has no {e.text}")
    return out


def sm90_bwd_does_not_build(head_dim: int, head_dim_v: int, causal: bool, local: bool) -> bool:
    """Finding (measured on an H200, 2026-11-30, ``kernels/evidence/golden/hd_sweep_h200.json``):
    FA4 4.0.0b36's SM90 backward does not compile at head dims 104 and 112 with
    ``_tile_size_bwd_sm90``'s non-causal m_block of 80 (``MLIRError: failed to partition``), though
    its interface accepts them. Only what was measured: causal and local (m_block 64) may build."""
    return head_dim == head_dim_v and head_dim in (104, 112) and not (causal or local)


def sm100_fp8_fwd_does_not_build(head_dim: int, head_dim_v: Optional[int] = None) -> bool:
    """Finding (compile-only for sm_100a on a CPU, FA4 4.0.0b36, 2026-12-05): FA4's SM 10.x forward
    of fp8 inputs does not compile at head dims 48, 80 and 112 (``MLIRError: failed to partition
    input '(128,80)' with tiled_mma`` in ``make_smem_layout_a`` of Q), though its interface accepts
    them (fp8 needs head dims that are multiples of 16); 16, 32, 64, 96, 128, (192, 128) and 256
    compile. The kernel pads the head dim to a multiple of 16 (``flash_fwd_sm100.py``
    ``hdim_multiple_of = 16``) while its 8-bit MMA takes K in steps of 32: the padded dims 48, 80
    and 112 (so every head dim that pads to them: 33..48, 65..80, 97..112) are refused by the
    layout. Measured at 48, 80 and 112; the others pad to the same kernels."""
    padded = -(-int(head_dim) // 16) * 16
    return padded > 16 and padded % 32 == 16


def sm90_sparse_bwd_does_not_build(head_dim: int, head_dim_v: Optional[int] = None) -> bool:
    """Finding (compile-only, docs/results/features/README.md): FA4 4.0.0b36's SM90 backward under
    block sparsity cannot be built for head dims in (192, 256) that are not a multiple of 64.

    Root cause, from FA4's source: ``_tile_size_bwd_sm90`` gives every head dim > 192 under
    sparsity a 64 x 64 tile with ``dKV_swapAB=False``, while its own comment on the dense hd-256
    config says ``dKV_swapAB`` "rounds tile_hdim to 64, which is what makes head_dim in (192, 256)
    compile"; without it ``flash_bwd_sm90`` tiles the head dim in 16s (208, 240 ...) and the dK/dV
    shared-memory epilogue (``epilogue_dKV`` -> ``quack.copy_utils.get_smem_store_C``) cannot be
    partitioned: the DSL aborts the process (hd 200/208/232/240) or raises ``MLIRError: unable to
    partition`` (hd 224). Narrow by construction: only this config (sparse, 192 < hd < 256, hd % 64
    != 0); hd 256 and every dense head dim build. Matches the compile-only census exactly."""
    hv = head_dim if head_dim_v is None else head_dim_v
    return 192 < max(head_dim, hv) < 256 and (head_dim % 64 != 0 or hv % 64 != 0)
