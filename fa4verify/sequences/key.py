"""What FA4's compile key holds, read from the installed FA4's source (Note [Compile-key attributes]).

Note [Compile-key attributes]
-----------------------------
FA4 caches compiled kernels per process (and on disk) under ``compile_key`` tuples built in
``flash_attn/cute/interface.py`` (``_flash_attn_fwd``, ``_flash_attn_bwd``); score_mod / mask_mod
callables enter the key through ``utils.hash_callable`` (their source, closure cells and, since
the defaults hashing was added, ``__defaults__``). A call attribute whose *value* changes the
kernel's meaning must be in the key, or be a runtime argument of the compiled kernel; when it is
neither, the second call of a process silently runs the first call's kernel.

:data:`ATTRIBUTES` lists the call attributes fa4verify can vary between calls, each with the key
expressions that carry its full value. :func:`analyse` reads the installed release's keys and
says, per attribute and direction, whether the key carries it; an attribute the key leaves out
(a runtime value, or a missing key field) is exactly what the state machine
(:mod:`fa4verify.sequences.machine`) must vary between calls with an unchanged key: if FA4 passes
it at run time the calls stay right, if FA4 bakes it in they go wrong.
``tests/test_sequences.py`` fails when the installed key leaves out an attribute the machine does
not vary (:data:`fa4verify.sequences.machine.VARIED`), unless the attribute is listed in
:data:`NOT_DRIVEN` with the reason fa4verify cannot pass it.

Read from 4.0.0b36 (``interface.py``): in both keys as values: dtype, head_dim(_v), causal, the
GQA ratio, deterministic (backward), broadcast (stride-0) patterns of the tensors and of the
block-sparse lists (``block_sparse_broadcast_pattern``: CuTe keeps a stride 0 static), score_mod /
mask_mod hashes (softcap becomes a score_mod closure, ``utils.create_softcap_scoremod``; a
constant captured as a default argument enters through ``__defaults__``). As
presence only (values at run time): window_size_left / right, cu_seqlens / seqused, page_table.
Absent: softmax_scale, seqlens, batch, head counts, the strides of non-broadcast dims, aux scalar
values (only their types: ``aux_scalar_metadata``); learnable_sink is in the forward key (its
dtype) but only as presence in the backward's (its dtype keys the backward's postprocess and dsink
kernels, compiled apart).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Optional

__all__ = ["CallAttribute", "ATTRIBUTES", "NOT_DRIVEN", "key_fields", "callable_hash_covers", "analyse",
           "left_out", "KEY_MUTANTS"]


@dataclasses.dataclass(frozen=True)
class CallAttribute:
    """A call attribute and the key expressions (source text of ``compile_key`` elements) that
    carry its full value; ``via_callable``: carried by the score_mod hash when ``hash_callable``
    hashes the closure (softcap: FA4 turns it into a score_mod closure), or its defaults
    (``mod_defaults``: a factory's ``def score_mod(..., c=c)``)."""
    name: str
    what: str
    fwd: Optional[tuple[str, ...]] = ()      # None: the direction has no such attribute
    bwd: Optional[tuple[str, ...]] = ()
    via_callable: Optional[str] = None      # "closure" | "defaults"


ATTRIBUTES: tuple[CallAttribute, ...] = (
    CallAttribute("dtype", "input dtype (bf16 / fp16)", ("dtype",), ("dtype",)),
    CallAttribute("head_dim", "head dim", ("head_dim",), ("head_dim",)),
    CallAttribute("gqa_ratio", "query heads per KV head", ("nheads_per_kv",), ("qhead_per_kvhead",)),
    CallAttribute("causal", "causal mask", ("causal",), ("causal",)),
    CallAttribute("window_left", "window_size left value", ("window_size_left",), ("window_size_left",)),
    CallAttribute("window_right", "window_size right value", ("window_size_right",), ("window_size_right",)),
    CallAttribute("softmax_scale", "softmax_scale value", ("softmax_scale",), ("softmax_scale",)),
    CallAttribute("softcap", "softcap value (a score_mod closure constant)", ("softcap",), ("softcap",),
                  via_callable="closure"),
    CallAttribute("sink", "learnable_sink present",
                  ("torch2cute_dtype_map[learnable_sink.dtype] if learnable_sink is not None else None",),
                  ("learnable_sink is not None",)),
    CallAttribute("sink_dtype", "learnable_sink dtype (fp32 / bf16; dsink is written in it)",
                  ("torch2cute_dtype_map[learnable_sink.dtype] if learnable_sink is not None else None",), ()),
    CallAttribute("sink_values", "learnable_sink values", (), ()),
    CallAttribute("seqlen", "sequence lengths", ("seqlen_q",), ("seqlen_q",)),
    CallAttribute("batch", "batch size", ("batch_size",), ("batch_size",)),
    CallAttribute("nheads", "head count at a fixed GQA ratio", ("num_head",), ("num_head",)),
    CallAttribute("layout_strided", "non-contiguous views (row stride > row)", (), ()),
    CallAttribute("layout_transposed", "transposed layouts ((b, h, s, d) storage)", (), ()),
    CallAttribute("layout_broadcast", "expanded K/V (stride 0 on a size-1 dim)",
                  ("tensor_broadcast_patterns",), ("get_broadcast_dims(k)",)),
    CallAttribute("block_broadcast", "block-sparse lists shared over batch and heads (extent 1, FA4 expands: stride 0)",
                  ("block_sparse_broadcast_pattern",), ("block_sparse_broadcast_pattern",)),
    CallAttribute("seqused_k", "seqused_k present", ("seqused_k is None",), ("seqused_k is None",)),
    CallAttribute("varlen", "cu_seqlens present", ("cu_seqlens_q is None",), ("cu_seqlens_q is None",)),
    CallAttribute("deterministic", "deterministic backward", None, ("deterministic",)),
    CallAttribute("aux_scalars", "aux scalar values of a score_mod", (), ()),
    CallAttribute("mod_defaults", "a score_mod constant captured as a default argument (the default_slope pair)",
                  (), (), via_callable="defaults"),
)

#: attributes the key may leave out that fa4verify cannot pass to FA4, with the reason (none
#: today: the aux scalars' values, which FA4 keys by type only, are driven through the
#: ``scalar_bias`` pair on production)
NOT_DRIVEN: dict[str, str] = {}


@functools.lru_cache(maxsize=4)
def key_fields(function: str) -> tuple[str, ...]:
    """The union of the ``compile_key`` element expressions in the installed FA4 ``function``
    (whitespace collapsed), read from source; () without FA4."""
    from fa4verify.kernels.adapter import compile_key_exprs
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    if d is None:
        return ()
    return tuple(dict.fromkeys(e for tup in compile_key_exprs(str(d / "interface.py"), function) for e in tup))


@functools.lru_cache(maxsize=1)
def callable_hash_covers() -> frozenset[str]:
    """What the installed ``utils.hash_callable`` hashes of a callable: "source", "closure",
    "defaults" (read from ``utils._compute_base_hash``' source)."""
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    if d is None:
        return frozenset()
    src = (d / "utils.py").read_text()
    out = set()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in ("_compute_base_hash", "hash_callable"):
            seg = ast.get_source_segment(src, node) or ""
            if "getsource" in seg or "co_code" in seg:
                out.add("source")
            if "__closure__" in seg:
                out.add("closure")
            if "__defaults__" in seg:
                out.add("defaults")
    return frozenset(out)


def _carried(attr: CallAttribute, exprs: Optional[tuple[str, ...]], fields: tuple[str, ...],
             score_hash: bool) -> bool:
    if exprs is None:
        return True
    if attr.via_callable is not None and score_hash and attr.via_callable in callable_hash_covers():
        return True
    return any(e in fields for e in exprs)


def analyse() -> dict[str, dict[str, bool]]:
    """``{attribute: {"fwd": carried, "bwd": carried}}`` for the installed FA4 (empty without it)."""
    ff, bf = key_fields("_flash_attn_fwd"), key_fields("_flash_attn_bwd")
    if not ff and not bf:
        return {}
    return {a.name: {"fwd": _carried(a, a.fwd, ff, "score_mod_hash" in ff),
                     "bwd": _carried(a, a.bwd, bf, "score_mod_hash" in bf)}
            for a in ATTRIBUTES}


def left_out() -> dict[str, list[str]]:
    """Attributes whose value the installed key leaves out: ``{attribute: [directions]}``."""
    return {n: [d for d, c in v.items() if not c] for n, v in analyse().items() if not all(v.values())}


def _key_mutants():
    """Note [Planted key faults]: compile-key faults planted in FA4's own source (a private copy,
    :mod:`fa4verify.mutants.source`), so every check of an audit run on the copy meets them -- the
    old checks and ``sequences.production`` alike (``--drop`` of ``python -m fa4verify.sequences
    run`` plants the same faults in the sequence target only). ``key_causal_dropped``: causal
    left out of the forward's and the backward's compile keys (a causal call after a non-causal
    one of equal key runs the non-causal kernel, or the reverse); ``key_closure_dropped``:
    ``utils._compute_base_hash`` no longer hashes a callable's closure cells, so score_mods that
    differ only in a captured constant share a kernel (softcap 5 and 30:
    ``utils.create_softcap_scoremod`` captures the value); ``aux_scalars_frozen``: a compiled
    forward / backward kernel keeps the ``aux_scalars`` of the call that compiled it for every
    later call of its key (what a kernel that folded the values under a key of their types
    computes), so a ``scalar_bias`` call after one with other scalars runs with the first's."""
    frozen = ("_FA4V_FROZEN = {}\n\n\n"
              "def _fa4v_frozen(kernel, scalars):\n"
              "    # planted fault: the aux scalars of the call that compiled ``kernel`` (kept alive here,\n"
              "    # so its id is not reused)\n"
              "    return _FA4V_FROZEN.setdefault(id(kernel), (kernel, scalars))[1]\n\n\n")
    from fa4verify.mutants.source import Edit, SourceMutant
    keep = ("            arch,\n            dtype,\n            head_dim,\n            head_dim_v,\n"
            "            qhead_per_kvhead,\n")
    return (
        SourceMutant("key_causal_dropped", "causal left out of FA4's forward and backward compile keys",
                     (Edit("interface.py",
                           "        num_head_kv if qv is not None else None,  # MLA kernels specialize on nheads_kv\n"
                           "        causal,\n",
                           "        num_head_kv if qv is not None else None,  # MLA kernels specialize on nheads_kv\n"),
                      Edit("interface.py",
                           "    if arch // 10 in [8, 9, 12]:\n        compile_key = (\n" + keep + "            causal,\n",
                           "    if arch // 10 in [8, 9, 12]:\n        compile_key = (\n" + keep),
                      Edit("interface.py",
                           "    else:\n        compile_key = (\n" + keep + "            causal,\n",
                           "    else:\n        compile_key = (\n" + keep)),
                     "both", ("out", "lse", "dq", "dk", "dv")),
        SourceMutant("key_closure_dropped",
                     "FA4's callable hash ignores closure cells (softcap values share a kernel)",
                     (Edit("utils.py",
                           "    if hasattr(func, \"__closure__\") and func.__closure__ is not None:\n"
                           "        for cell in func.__closure__:\n"
                           "            hasher.update(repr(cell.cell_contents).encode())\n",
                           ""),),
                     "both", ("out", "lse", "dq", "dk", "dv")),
        SourceMutant("aux_scalars_frozen",
                     "FA4's kernels keep the aux_scalars of the call that compiled them",
                     (Edit("interface.py", "def _flash_attn_fwd(\n", frozen + "def _flash_attn_fwd(\n"),
                      Edit("interface.py",
                           "                AuxData(aux_tensors, aux_scalars),\n",
                           "                AuxData(aux_tensors, _fa4v_frozen(_flash_attn_fwd.compile_cache[compile_key], "
                           "aux_scalars)),\n"),
                      Edit("interface.py",
                           "            AuxData(aux_tensors, aux_scalars),\n            (\n",
                           "            AuxData(aux_tensors, _fa4v_frozen(_flash_attn_bwd.compile_cache[compile_key], "
                           "aux_scalars)),\n            (\n")),
                     "both", ("out", "lse", "dq", "dk", "dv")),
    )


#: compile-key faults planted in FA4's source (Note [Planted key faults])
KEY_MUTANTS = _key_mutants()

