"""The numeric knobs of the installed FlashAttention-4, read from its source.

The one importer of ``flash_attn.cute`` for FA4's parameters (the knobs below, FA4's own
backward tile function ``_tile_size_bwd_sm90`` for the SM90 dQ-accumulator rule, the SM count
its heuristics read, :func:`selection_sms`, and Note [Kernel variants]'s SM 10.x kernel
configurations: :func:`recording_compiles` records the kernel objects FA4's host code builds,
:func:`sm100_fwd_variant_key` / :func:`sm100_bwd_variant_key` key them); production
kernels go through :mod:`fa4verify.kernels.adapter`.

``load_params()`` returns the values the twin (``fa4verify.kernels.twin``) and the sweeps need:

* ``POLY_EX2``            -- the exp2 polynomial coefficients (``flash_attn/cute/utils.py``),
* ``_TUNING_CONFIG``      -- per-(2cta, causal, hd_pad, sm103) emulation frequency / start fragment,
* ``_FP8_TUNING_CONFIG``  -- the FP8 overrides (both in ``flash_attn/cute/flash_fwd_sm100.py``),
* ``rescale_threshold``   -- 8.0 for 16-bit inputs, and ``max_offset`` -- 8 for fp8 inputs: both are
  hard-coded expressions in ``flash_fwd_sm100.py``; they are parsed from the source text with a
  regular expression and a missing pattern raises :class:`FA4SourceChanged`.

Method
------
The dict literals are read from the *installed* source files with :mod:`ast` (``ast.literal_eval``
of the assignment), which takes milliseconds; importing ``flash_attn.cute`` takes ~5 s and is not
needed. ``tests/test_fa4_params_*.py`` checks that the parsed values equal the imported module's
attributes. Results are cached per process.

When flash-attn-4 is not installed, the pinned copy ``kernels/data/pinned_fa4_params.json`` is used
and ``FA4Params.source`` says so. The pinned copy is generated, never edited by hand::

    python -m fa4verify.kernels.fa4_params --write-pinned kernels/data/pinned_fa4_params.json

Possible issues
---------------
Only the textual form of the knobs is checked here; that the twin's *logic* still matches FA4 is
checked by the source-shape tests in ``tests/test_fa4_params_source_shape.py`` (they fail with a
clear message when FA4 changes the code around ``apply_exp2_convert`` / ``ex2_emulation_2``).
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = [
    "DSL_DIST",
    "FA4_DIST",
    "PINNED_PATH",
    "FA4Params",
    "FA4SourceChanged",
    "fa4_source_dir",
    "load_params",
    "params_to_json",
    "combine_partial_tiling",
]

FA4_DIST = "flash-attn-4"
DSL_DIST = "nvidia-cutlass-dsl"
PINNED_PATH = Path(__file__).resolve().parent / "data" / "pinned_fa4_params.json"

TuneKey = tuple  # (use_2cta_instrs: bool, is_causal: bool, head_dim_padded: int, is_sm103: bool)


class FA4SourceChanged(RuntimeError):
    """The installed FA4 source no longer has the shape fa4verify's twin assumes."""


@dataclass(frozen=True)
class FA4Params:
    """Numeric knobs of FA4 (see module docstring for where each one comes from).

    ``poly_ex2[d]`` holds the ``d + 1`` coefficients ``(c0, ..., cd)`` of the degree-``d`` exp2
    polynomial (c0 == 1.0; every value is an exact binary32 number). ``tuning_config`` and
    ``fp8_tuning_config`` map ``(use_2cta_instrs, is_causal, head_dim_padded, is_sm103)`` to the
    per-config knob dict. ``rescale_threshold_16bit`` (log2 units) is the lazy-rescale threshold for
    fp16/bf16 inputs; ``max_offset_fp8`` (log2 units) the P scaling offset for fp8 inputs.
    """

    poly_ex2: dict[int, tuple[float, ...]]
    tuning_config: dict[TuneKey, dict[str, Any]]
    fp8_tuning_config: dict[TuneKey, dict[str, Any]]
    rescale_threshold_16bit: float
    max_offset_fp8: float
    source: str
    fa4_version: str | None
    dsl_version: str | None
    rescale_threshold_other: float = 0.0
    max_offset_other: float = 0.0
    files: dict[str, str] = field(default_factory=dict)

    @property
    def max_exp2_argument(self) -> float:
        """Largest exponent argument FA4's forward feeds to exp2 (log2 units):
        ``max(max_offset) + max(rescale_threshold)`` = 8 for the current source."""
        return max(self.max_offset_fp8 + self.rescale_threshold_other,
                   self.max_offset_other + self.rescale_threshold_16bit)

    @property
    def installed(self) -> bool:
        return self.source.startswith("installed")


from fa4verify.kernels.facts import dist_version as _dist_version  # noqa: E402


def fa4_source_dir() -> Path | None:
    """Directory of the installed ``flash_attn/cute`` sources (without importing them), or None.
    The package's locations are those of an imported ``flash_attn``, else ``find_spec``'s, looked
    up once per ``sys.path`` (the coverage planner asks tens of thousands of times per plan, and
    ``find_spec`` walks the path; a package installed into the path during the process is seen
    once ``sys.path`` changes); a directory whose files have gone since is looked up again."""
    if os.environ.get("FA4VERIFY_FORCE_PINNED") == "1":
        return None
    mod = sys.modules.get("flash_attn")
    if mod is not None:
        spec = getattr(mod, "__spec__", None)
        locs = tuple(getattr(spec, "submodule_search_locations", None) or getattr(mod, "__path__", None) or ())
    else:
        locs = _search_locations(tuple(sys.path))
    d = _cute_dir(locs)
    if d is not None and not os.path.isfile(os.path.join(d, "utils.py")):     # gone since: look again
        _cute_dir.cache_clear()
        d = _cute_dir(locs)
    return None if d is None else Path(d)


@functools.lru_cache(maxsize=8)
def _cute_dir(locs: tuple) -> Optional[str]:
    """The first ``<loc>/cute`` of ``locs`` holding FA4's ``utils.py`` and ``flash_fwd_sm100.py``."""
    for loc in locs:
        d = os.path.join(loc, "cute")
        if os.path.isfile(os.path.join(d, "utils.py")) and os.path.isfile(os.path.join(d, "flash_fwd_sm100.py")):
            return d
    return None


@functools.lru_cache(maxsize=8)
def _search_locations(path: tuple) -> tuple:
    """``find_spec("flash_attn")``'s package locations with ``sys.path == path`` (empty: none)."""
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(spec.submodule_search_locations)


@functools.lru_cache(maxsize=16)
def installed_rule(name: str) -> Optional[Callable[..., Any]]:
    """The installed FA4 release's own pure-Python rule ``name`` of ``interface.py`` (e.g.
    ``_resolve_causal_local_window``, ``_validate_head_dims``), compiled from its source text in
    an empty namespace (no import of FA4, torch or the DSL), or None when FA4 is not installed
    (or ``FA4VERIFY_FORCE_PINNED=1``) or the release has no such function. Each release's rule is
    its own (4.0.0b30 moved the window rule's both-negative check before ``causal``; docs/howto.md),
    so the facts that follow a rule read it from the release that runs."""
    d = fa4_source_dir()
    if d is None:
        return None
    path = d / "interface.py"
    try:
        src = path.read_text()
    except OSError:
        return None
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            mod = ast.Module(body=[node], type_ignores=[])
            ns: dict[str, Any] = {}
            exec(compile(mod, str(path), "exec"), ns)   # noqa: S102 - FA4's own rule, from its file
            return ns[name]
    return None


def _literal_assignment(src: str, name: str, path: Path) -> Any:
    tree = ast.parse(src, filename=str(path))
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Name) and t.id == name:
                try:
                    return ast.literal_eval(node.value)
                except ValueError as e:
                    raise FA4SourceChanged(
                        f"{path}: `{name}` is no longer a plain literal ({e}); "
                        "update fa4verify.kernels.fa4_params") from e
    raise FA4SourceChanged(f"{path}: module-level assignment `{name} = ...` not found; "
                           "FA4 changed, update fa4verify.kernels.fa4_params")


# `rescale_threshold = 8.0 if const_expr(self.q_dtype.width == 16) else 0.0`
_RESCALE_RE = re.compile(
    r"rescale_threshold\s*=\s*(?P<yes>[0-9]+(?:\.[0-9]*)?)\s+if\s+(?:cutlass\.)?const_expr\(\s*"
    r"self\.q_dtype\.width\s*==\s*16\s*\)\s+else\s+(?P<no>[0-9]+(?:\.[0-9]*)?)")
# 4.0.0b20..b23: `rescale_threshold = (8.0 if const_expr(self.q_dtype.width == 16) else
# 4.0 if const_expr(self.q_dtype.width == 8) else 0.0)`: the 16-bit value, then the 8-bit (fp8)
# one, which is the "other" value of the two-way form (FA4 takes no wider non-16-bit input)
_RESCALE3_RE = re.compile(
    r"rescale_threshold\s*=\s*\(\s*(?P<yes>[0-9]+(?:\.[0-9]*)?)\s+if\s+(?:cutlass\.)?const_expr\(\s*"
    r"self\.q_dtype\.width\s*==\s*16\s*\)\s+else\s+(?P<no>[0-9]+(?:\.[0-9]*)?)\s+if\s+"
    r"(?:cutlass\.)?const_expr\(\s*self\.q_dtype\.width\s*==\s*8\s*\)\s+else\s+[0-9]+(?:\.[0-9]*)?\s*\)")
# `max_offset = 8 if cutlass.const_expr(self.q_dtype.width == 8) else 0`
_MAX_OFFSET_RE = re.compile(
    r"max_offset\s*=\s*(?P<yes>[0-9]+(?:\.[0-9]*)?)\s+if\s+(?:cutlass\.)?const_expr\(\s*"
    r"self\.q_dtype\.width\s*==\s*8\s*\)\s+else\s+(?P<no>[0-9]+(?:\.[0-9]*)?)")
# 4.0.0b23: `max_offset = (4 if cutlass.const_expr(self.q_dtype is cutlass.Float8E4M3FN) else
# 8 if cutlass.const_expr(self.q_dtype.width == 8) else 0)`: e4m3 first (fa4verify's one fp8,
# kernels/twin/fp32.py), then e5m2, then 16-bit; the e4m3 and 16-bit values are the two-way form's
_MAX_OFFSET3_RE = re.compile(
    r"max_offset\s*=\s*\(\s*(?P<yes>[0-9]+(?:\.[0-9]*)?)\s+if\s+(?:cutlass\.)?const_expr\(\s*"
    r"self\.q_dtype\s+is\s+(?:cutlass\.)?Float8E4M3FN\s*\)\s+else\s+[0-9]+(?:\.[0-9]*)?\s+if\s+"
    r"(?:cutlass\.)?const_expr\(\s*self\.q_dtype\.width\s*==\s*8\s*\)\s+else\s+(?P<no>[0-9]+(?:\.[0-9]*)?)\s*\)")


def _one_value(regex: re.Pattern | tuple[re.Pattern, ...], src: str, what: str, path: Path) -> tuple[float, float]:
    regexes = regex if isinstance(regex, tuple) else (regex,)
    hits = {(float(m["yes"]), float(m["no"])) for r in regexes for m in r.finditer(src)}
    if not hits:
        raise FA4SourceChanged(
            f"{path}: the hard-coded `{what}` expression was not found (pattern "
            f"{' or '.join(repr(r.pattern) for r in regexes)}); FA4 changed, update fa4verify.kernels.fa4_params")
    if len(hits) > 1:
        raise FA4SourceChanged(f"{path}: `{what}` is set to different values in different places: "
                               f"{sorted(hits)}; update fa4verify.kernels.fa4_params")
    return hits.pop()


def _normalise_poly(raw: dict) -> dict[int, tuple[float, ...]]:
    out: dict[int, tuple[float, ...]] = {}
    for d, coeffs in raw.items():
        t = tuple(float(c) for c in (coeffs if isinstance(coeffs, (tuple, list)) else (coeffs,)))
        if len(t) != int(d) + 1:
            raise FA4SourceChanged(f"POLY_EX2[{d}] has {len(t)} coefficients, expected {int(d) + 1}")
        out[int(d)] = t
    return out


def _read_installed(d: Path) -> FA4Params:
    utils_py, fwd_py = d / "utils.py", d / "flash_fwd_sm100.py"
    usrc, fsrc = utils_py.read_text(), fwd_py.read_text()
    poly = _normalise_poly(_literal_assignment(usrc, "POLY_EX2", utils_py))
    tune = _literal_assignment(fsrc, "_TUNING_CONFIG", fwd_py)
    fp8 = _literal_assignment(fsrc, "_FP8_TUNING_CONFIG", fwd_py)
    rt16, rt_other = _one_value((_RESCALE_RE, _RESCALE3_RE), fsrc, "rescale_threshold", fwd_py)
    mo8, mo_other = _one_value((_MAX_OFFSET_RE, _MAX_OFFSET3_RE), fsrc, "max_offset", fwd_py)
    fa4v = _dist_version(FA4_DIST)
    return FA4Params(
        poly_ex2=poly, tuning_config=dict(tune), fp8_tuning_config=dict(fp8),
        rescale_threshold_16bit=rt16, max_offset_fp8=mo8,
        rescale_threshold_other=rt_other, max_offset_other=mo_other,
        source=f"installed {FA4_DIST} {fa4v}", fa4_version=fa4v,
        dsl_version=_dist_version(DSL_DIST),
        files={"utils.py": str(utils_py), "flash_fwd_sm100.py": str(fwd_py)},
    )


def params_to_json(p: FA4Params) -> dict:
    """JSON-able form of ``p`` (tuple keys become lists). Used for the pinned copy and reports."""
    def table(t):
        return [[list(k), v] for k, v in sorted(t.items(), key=lambda kv: repr(kv[0]))]
    return {
        "schema": "fa4verify.fa4_params/1",
        "generator": "python -m fa4verify.kernels.fa4_params --write-pinned PATH (never edit by hand)",
        "fa4_version": p.fa4_version, "dsl_version": p.dsl_version,
        "poly_ex2": {str(k): list(v) for k, v in sorted(p.poly_ex2.items())},
        "poly_ex2_hex": {str(k): [float(c).hex() for c in v] for k, v in sorted(p.poly_ex2.items())},
        "tuning_config": table(p.tuning_config),
        "fp8_tuning_config": table(p.fp8_tuning_config),
        "rescale_threshold_16bit": p.rescale_threshold_16bit,
        "rescale_threshold_other": p.rescale_threshold_other,
        "max_offset_fp8": p.max_offset_fp8, "max_offset_other": p.max_offset_other,
    }


def _read_pinned(path: Path = PINNED_PATH) -> FA4Params:
    data = json.loads(path.read_text())
    poly = {int(k): tuple(float.fromhex(h) for h in v) for k, v in data["poly_ex2_hex"].items()}
    def table(rows):
        return {tuple(k): dict(v) for k, v in rows}
    return FA4Params(
        poly_ex2=poly, tuning_config=table(data["tuning_config"]),
        fp8_tuning_config=table(data["fp8_tuning_config"]),
        rescale_threshold_16bit=float(data["rescale_threshold_16bit"]),
        max_offset_fp8=float(data["max_offset_fp8"]),
        rescale_threshold_other=float(data["rescale_threshold_other"]),
        max_offset_other=float(data["max_offset_other"]),
        source=f"pinned copy ({FA4_DIST} not installed; pinned from {data['fa4_version']})",
        fa4_version=None, dsl_version=_dist_version(DSL_DIST),
        files={"pinned": str(path)},
    )


@functools.cache
def load_params() -> FA4Params:
    """FA4's numeric knobs from the installed flash-attn-4, else from the pinned JSON copy.

    Set ``FA4VERIFY_FORCE_PINNED=1`` to use the pinned copy even when FA4 is installed (tests).
    Raises :class:`FA4SourceChanged` when FA4 is installed but its source no longer has the
    expected shape (never silently falls back to the pinned copy in that case).
    """
    d = fa4_source_dir()
    if d is not None:
        return _read_installed(d)
    return _read_pinned()


def _main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-pinned", metavar="PATH", help="write the pinned JSON copy from the installed FA4")
    args = ap.parse_args(argv)
    d = fa4_source_dir()
    if args.write_pinned:
        if d is None:
            print("fa4_params: flash-attn-4 is not installed; cannot generate the pinned copy", file=sys.stderr)
            return 2
        Path(args.write_pinned).write_text(json.dumps(params_to_json(_read_installed(d)), indent=2) + "\n")
        print(f"wrote {args.write_pinned}")
        return 0
    print(json.dumps(params_to_json(load_params()), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())


# --------------------------------------------------------------------------- SM90 dQ accumulator
# flash-attn-4 4.0.0b36, SM90 backward: the main kernel tiles the fp32 dQ accumulator with
# ``tile_hdim = ceil(hd / a) * a`` (flash_bwd_sm90.py: ``hdim_multiple_of = 64 if dKV_swapAB else 16``)
# while the interface allocates it and the postprocess reads it with ``ceil(hd / b) * b``
# (interface.py: ``hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 32``).  Where the
# two roundings differ the postprocess reads a layout other than the one written: dQ is wrong, dK
# and dV are right.  Measured on the H200 (docs/results/h200/README.md, finding 2).
_MAIN_ROUND_RE = re.compile(r"hdim_multiple_of\s*=\s*(\d+)\s+if\s+dKV_swapAB\s+else\s+(\d+)")
_ACCUM_ROUND_RE = re.compile(
    r"hdim_multiple_of\s*=\s*(\d+)\s+if\s+arch\s*//\s*10\s*==\s*9\s+and\s+dKV_swapAB\s+else\s+(\d+)")


def selection_sms(arch: str) -> Optional[int]:
    """The SM count FA4's heuristics read for ``arch`` ("sm100", ...): its own
    ``cute_dsl_utils.get_num_sms_for_selection`` (``FLASH_ATTENTION_NUM_SMS``, else the local GPU
    when it is of that arch); None where FA4 cannot say (no FA4, no such GPU here)."""
    try:
        import torch
        from flash_attn.cute.cute_dsl_utils import get_num_sms_for_selection
        dev = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return int(get_num_sms_for_selection(dev, int(arch[2:])))
    except Exception:  # noqa: BLE001 - no FA4, no GPU of the arch, no override
        return None


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@functools.cache
def sm90_dq_accum_roundings() -> dict[str, Any]:
    """The two head-dim roundings of the SM90 dQ accumulator, read from the installed FA4 source:
    ``{"main": (swapAB, plain), "accum": (swapAB, plain), "source": dir}``; a missing package or a
    changed pattern gives ``{"error": reason}`` (never raises)."""
    d = fa4_source_dir()
    if d is None:
        return {"error": "flash-attn-4 is not installed"}
    try:
        main_src = (d / "flash_bwd_sm90.py").read_text()
        intf_src = (d / "interface.py").read_text()
    except OSError as e:
        return {"error": f"cannot read FA4 source: {e}"}
    m = _MAIN_ROUND_RE.search(main_src)
    a = _ACCUM_ROUND_RE.search(intf_src)
    if m is None or a is None:
        return {"error": "the dQ-accumulator rounding pattern is not in this FA4 release "
                         "(flash_bwd_sm90.py / interface.py changed); re-derive the known issue"}
    return {"main": (int(m.group(1)), int(m.group(2))), "accum": (int(a.group(1)), int(a.group(2))),
            "source": str(d)}


@functools.cache
def sm90_sparse_bwd_unwritten() -> dict[str, Any]:
    """Whether the installed FA4's SM90 block-sparse backward has the shape of known issue
    ``sm90_sparse_bwd_left_window_unwritten`` (Note [Unwritten KV tiles under a left window] in
    fa4verify/fuzz/known_issues.py), read from its source without importing it:
    ``block_sparse_utils.get_total_q_block_count_bwd``'s body never reads ``m_block_max``, and
    ``consume_block_sparse_mma_bwd_sm90`` runs a subtile only under ``m_block < m_block_max``.
    ``{"defect": bool, "source": dir}``; without FA4 installed the pinned release's answer
    (4.0.0b36: ``{"defect": True, "source": "pinned"}``); ``{"error": reason}`` where the functions
    are not there (re-derive the issue). Never raises."""
    d = fa4_source_dir()
    if d is None:
        return {"defect": True, "source": "pinned"}
    try:
        tree = ast.parse((d / "block_sparse_utils.py").read_text())
    except (OSError, SyntaxError) as e:
        return {"error": f"cannot read FA4 source: {e}"}
    fns = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    count, consume = fns.get("get_total_q_block_count_bwd"), fns.get("consume_block_sparse_mma_bwd_sm90")
    if count is None or consume is None:
        return {"error": "get_total_q_block_count_bwd / consume_block_sparse_mma_bwd_sm90 are not in this FA4 "
                         "release's block_sparse_utils.py; re-derive the known issue"}
    reads = any(isinstance(n, ast.Name) and n.id == "m_block_max" for st in count.body for n in ast.walk(st))
    skips = any(isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and n.left.id == "m_block"
                and len(n.ops) == 1 and isinstance(n.ops[0], ast.Lt)
                and isinstance(n.comparators[0], ast.Name) and n.comparators[0].id == "m_block_max"
                for n in ast.walk(consume))
    return {"defect": bool(skips and not reads), "source": str(d)}


@functools.lru_cache(maxsize=1024)
def sm90_fwd_variant_config(head_dim: int, head_dim_v: int, causal: bool, local: bool,
                            block: Optional[tuple[int, int]] = None) -> Optional[tuple[int, int, bool, bool]]:
    """FA4's own SM90 forward configuration (``_tile_size_fwd_sm90``, fitted to a block-sparse
    ``block`` (q, kv) by ``_fit_sm90_fwd_tile_to_block_sparsity``): ``(tile_m, tile_n,
    mma_pv_is_rs, intra_wg_overlap)``; None without FA4 (Note [Kernel variants])."""
    try:
        from flash_attn.cute.interface import _fit_sm90_fwd_tile_to_block_sparsity, _tile_size_fwd_sm90
        c = _tile_size_fwd_sm90(head_dim, head_dim_v, causal, local, sparse_block_size_q=block[0] if block else None)
        if block:
            c = _fit_sm90_fwd_tile_to_block_sparsity(c, block[0], block[1])
    except Exception:  # noqa: BLE001 - FA4 import needs the CuTe DSL
        return None
    return int(c.m_block_size), int(c.n_block_size), bool(c.mma_pv_is_rs), bool(c.intra_wg_overlap)


@functools.lru_cache(maxsize=1024)
def sm90_bwd_variant_config(head_dim: int, head_dim_v: int, causal: bool, local: bool,
                            sparse_q: Optional[int] = None) -> Optional[tuple]:
    """Every field of FA4's own SM90 backward configuration (``_tile_size_bwd_sm90``, with a
    block-sparse ``sparse_q``): tiles, stages, the three swapAB flags, the atom layouts, the MMA
    warpgroups and the single dQ warpgroup; None without FA4 (Note [Kernel variants])."""
    try:
        from flash_attn.cute.interface import _tile_size_bwd_sm90
        c = _tile_size_bwd_sm90(head_dim, head_dim_v, causal, local, sparse_block_size_q=sparse_q)
    except Exception:  # noqa: BLE001
        return None
    return (int(c.m_block_size), int(c.n_block_size), int(c.num_stages_Q), int(c.num_stages_dO),
            int(c.num_stages_PdS), bool(c.SdP_swapAB), bool(c.dKV_swapAB), bool(c.dQ_swapAB), int(c.AtomLayoutMSdP),
            int(c.AtomLayoutNdKV), int(c.AtomLayoutMdQ), int(c.num_wg), bool(c.dQ_single_wg))


@functools.lru_cache(maxsize=256)
def sm90_bwd_tile_config(head_dim: int, head_dim_v: int, causal: bool = False,
                         local: bool = False) -> Optional[tuple[int, int, int, int, int]]:
    """FA4's own SM90 backward tile at these head dims (``_tile_size_bwd_sm90``): ``(m_block,
    n_block, num_stages_Q, num_stages_dO, num_stages_PdS)``: the first fields of
    :func:`sm90_bwd_variant_config`; None without FA4."""
    c = sm90_bwd_variant_config(head_dim, head_dim_v, causal, local)
    return None if c is None else c[:5]


#: Note [Pinned roundings]: the two roundings as flash-attn-4 4.0.0b36 ships them (the lines quoted
#: above; ``(swapAB, plain)``), the release whose dQ defect was measured.  The installed source
#: predicts where the defect is; a known issue absorbs only where this pinned pair predicts it too,
#: so a release or a fault that moves either line (red-team round 12's
#: ``sm90_bwd_accum_round64_widened``: the accumulator rounded to 64, hd 24/32/88/96 newly wrong)
#: moves the prediction but not what is absorbed, and :func:`sm90_dq_accum_mismatch` says
#: ``moved`` there.
SM90_DQ_ACCUM_ROUNDINGS_PINNED = {"main": (64, 16), "accum": (64, 32)}


def sm90_dq_accum_mismatch(head_dim: int, head_dim_v: int, *, causal: bool = False,
                           local: bool = False) -> dict[str, Any]:
    """Whether FA4's SM90 backward writes and reads the dQ accumulator with different head-dim
    roundings for this problem (``mismatch``: True/False from the installed source, or None when
    it cannot be decided, with ``reason``; ``pinned_mismatch``: the same from
    :data:`SM90_DQ_ACCUM_ROUNDINGS_PINNED`; ``moved``: the two disagree).  ``dKV_swapAB`` comes
    from FA4's own ``_tile_size_bwd_sm90``."""
    r = sm90_dq_accum_roundings()
    if "error" in r:
        return {"mismatch": None, "reason": r["error"]}
    try:
        from flash_attn.cute.interface import _tile_size_bwd_sm90
        swap = bool(_tile_size_bwd_sm90(head_dim, head_dim_v, causal, local).dKV_swapAB)
    except Exception as e:  # noqa: BLE001 - FA4 import needs the CuTe DSL; report, do not raise
        return {"mismatch": None, "reason": f"FA4's _tile_size_bwd_sm90 unavailable ({type(e).__name__}: {e})"}
    i = 0 if swap else 1
    main, accum = _round_up(head_dim, r["main"][i]), _round_up(head_dim, r["accum"][i])
    pin = SM90_DQ_ACCUM_ROUNDINGS_PINNED
    pinned = _round_up(head_dim, pin["main"][i]) != _round_up(head_dim, pin["accum"][i])
    return {"mismatch": main != accum, "pinned_mismatch": pinned, "moved": (main != accum) != pinned,
            "dKV_swapAB": swap, "main_tile_hdim": main, "accum_tile_hdim": accum}


#: Rows of each sequence that FA4's SM90 backward still gets right under the dQ-accumulator
#: mismatch: the first 64 (one dQ warpgroup's chunk of the 128-row tile sits at offset 0 under
#: either rounding).  MEASURED on the H200 for hd 8 and 40 (seqlen_q 1..64 correct, 65 and up
#: wrong; kernels/evidence/golden/hd_sweep_seqlens_h200.json), not derived from the source.
SM90_DQ_DEFECT_GOOD_ROWS = 64


def sm90_dq_defect_predicted(head_dim: int, head_dim_v: int, seqlens_q, *, causal: bool = False,
                             local: bool = False, varlen: bool = False, pinned: bool = False) -> bool | None:
    """Whether production dQ is expected wrong: the head-dim rounding mismatch holds and some
    sequence has more than :data:`SM90_DQ_DEFECT_GOOD_ROWS` query rows, or (varlen, unverified on
    hardware) a non-empty sequence other than the first, whose accumulator offset is also scaled
    by the mismatched rounding.  None when the mismatch cannot be decided.  ``pinned``: the
    mismatch must hold under the pinned release's roundings as well (Note [Pinned roundings]):
    what a known issue may absorb."""
    r = sm90_dq_accum_mismatch(head_dim, head_dim_v, causal=causal, local=local)
    m = r["mismatch"] and (r["pinned_mismatch"] if pinned else True)
    if not m:
        return m
    lens = [int(x) for x in seqlens_q]
    if any(n > SM90_DQ_DEFECT_GOOD_ROWS for n in lens):
        return True
    return bool(varlen and any(n > 0 for n in lens[1:]))


def sm90_accum_misread(lens: Sequence[int], head_dim: int, tile: int, packed: bool) -> list[np.ndarray]:
    """Note [The misread accumulator]: where FA4 4.0.0b36's SM90 backward postprocess reads each
    element of an fp32 accumulator (dQ; with GQA, dK and dV) that its main kernel wrote with the
    other head-dim rounding (:data:`SM90_DQ_ACCUM_ROUNDINGS_PINNED`, plain path: written with
    ``Dw = round_up(hd, 16)``, read with ``Dr = round_up(hd, 32)``).

    Both sides lay a (row G, column c) element of one head's buffer at ``64 Dw|Dr (G // 64) + 512
    (c // 8) + phi(G % 64, c % 8)`` (64-row slabs; 512-float chunks per 8 columns; ``phi`` the
    WGMMA accumulator's order inside a 64 x 8 block, the same on both sides: flash_bwd_sm90.py
    writes each warpgroup's chunk with one bulk reduce-add, flash_bwd_postprocess.py reads it back;
    derived from the source and CuTe's layout algebra by a helper, ``docs/results/dq_misread/``).
    So the reader's chunk ``O = (G // 64) (Dr // 8) + c // 8`` is the writer's chunk ``(s', j') =
    divmod(O, Dw // 8)``: the element of row ``64 s' + G % 64``, column ``8 j' + c % 8``. Rows of a
    packed varlen call live at ``(cu_seqlens[b] + b tile) // tile * tile + row``, so a read may land
    in another sequence. Returns, per sequence ``b``, an int array (len_b, head_dim, 3): the
    (sequence, row, column) of the true accumulator returned there, or -1 where the read lands on
    memory the kernel never wrote or on a padded row or column (0: the preprocess zeroes the buffer,
    padded rows and columns add 0). Where ``Dw == Dr`` every element is its own."""
    lens = [int(n) for n in lens]
    pin = SM90_DQ_ACCUM_ROUNDINGS_PINNED
    dw, dr = _round_up(head_dim, pin["main"][1]), _round_up(head_dim, pin["accum"][1])
    if packed:
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        base = [int((cu[b] + b * tile) // tile * tile) for b in range(len(lens))]
    else:
        base = [0] * len(lens)
    out = []
    c = np.arange(head_dim)[None, :]
    # the sequences' row ranges [base, base + len) are disjoint and their bases increase (a packed
    # sequence starts a tile past the previous one's end): the one a read row may lie in is the
    # last whose base is at or below it
    base_a, lens_a = np.asarray(base, np.int64), np.asarray(lens, np.int64)
    for b, n in enumerate(lens):
        g = base[b] + np.arange(n)[:, None]
        o = (g // 64) * (dr // 8) + c // 8
        s2, j2 = np.divmod(o, dw // 8)
        g2, c2 = np.broadcast_arrays(64 * s2 + g % 64, 8 * j2 + c % 8)
        src = np.full((n, head_dim, 3), -1, np.int64)
        bb = (np.clip(np.searchsorted(base_a, g2, side="right") - 1, 0, None) if packed
              else np.full(g2.shape, b, np.int64))
        hit = (g2 >= base_a[bb]) & (g2 < base_a[bb] + lens_a[bb]) & (c2 < head_dim)
        src[hit] = np.stack([bb[hit], g2[hit] - base_a[bb[hit]], c2[hit]], 1)
        out.append(src)
    return out


# --- the public combine's O-partial copy tiling (a finding, flash_attn_combine) -------

_COMBINE_KBLOCK_RE = re.compile(r"k_block_size\s*=\s*(\d+)\s+if\s+head_dim\s*<=\s*(\d+)\s+else\s+(\d+)")
_COMBINE_TILEM_RE = re.compile(
    r"tile_m\s*=\s*(\d+)\s+if\s+k_block_size\s*%\s*128\s*==\s*0\s+else\s+\((\d+)\s+if\s+k_block_size\s*%\s*64"
    r"\s*==\s*0\s+else\s+(\d+)\)")
_COMBINE_THREADS_RE = re.compile(r"num_threads:\s*int\s*=\s*(\d+)")
_COMBINE_COPYBITS_RE = re.compile(r"universal_copy_bits\s*=\s*(\d+)")
_COMBINE_KGMEM_RE = re.compile(
    r"k_block_gmem\s*=\s*\(\s*(\d+)\s+if\s+self\.k_block_size\s*%\s*128\s*==\s*0\s+else\s+\((\d+)\s+if\s+"
    r"self\.k_block_size\s*%\s*64\s*==\s*0\s+else\s+(\d+)\)")


@functools.cache
def _combine_source_rules() -> dict[str, Any]:
    d = fa4_source_dir()
    if d is None:
        return {"error": "flash-attn-4 is not installed"}
    try:
        intf = (d / "interface.py").read_text()
        comb = (d / "flash_fwd_combine.py").read_text()
    except OSError as e:
        return {"error": f"cannot read FA4 source: {e}"}
    kb, tm = _COMBINE_KBLOCK_RE.search(intf), _COMBINE_TILEM_RE.search(intf)
    th, cb, kg = (_COMBINE_THREADS_RE.search(comb), _COMBINE_COPYBITS_RE.search(comb),
                  _COMBINE_KGMEM_RE.search(comb))
    if None in (kb, tm, th, cb, kg):
        return {"error": "the combine's tile rules are not in this FA4 release (interface.py / "
                         "flash_fwd_combine.py changed); re-derive the known issue"}
    return {"k_block": tuple(int(x) for x in kb.groups()), "tile_m": tuple(int(x) for x in tm.groups()),
            "num_threads": int(th.group(1)), "copy_bits": int(cb.group(1)),
            "k_block_gmem": tuple(int(x) for x in kg.groups()), "source": str(d)}


def combine_partial_tiling(head_dim: int, partial_bits: int) -> dict[str, Any]:
    """How FA4's public ``flash_attn_combine`` tiles the O-partial load, read from the installed
    source: ``tile_m`` (rows per CTA tile, chosen in ``interface.py`` from the head dim alone),
    ``rows_per_copy_pass`` (``num_threads / (k_block_gmem / (copy_bits / partial_bits))``: the
    rows one pass of the 128-bit cp.async thread layout covers) and ``overrun`` (the copy layout
    covers more rows than the tile). ``{"overrun": None, "reason": ...}`` when undecidable.

    For fp32 partials (what FA4's own split-KV path writes) the two agree; for 16-bit partials,
    which the public API accepts, the copy covers twice the tile's rows."""
    r = _combine_source_rules()
    if "error" in r:
        return {"overrun": None, "reason": r["error"]}
    kb_small, kb_cut, kb_big = r["k_block"]
    k_block = kb_small if head_dim <= kb_cut else kb_big
    t128, t64, t_else = r["tile_m"]
    tile_m = t128 if k_block % 128 == 0 else (t64 if k_block % 64 == 0 else t_else)
    g128, g64, g_else = r["k_block_gmem"]
    k_gmem = g128 if k_block % 128 == 0 else (g64 if k_block % 64 == 0 else g_else)
    elems = r["copy_bits"] // int(partial_bits)
    threads_per_row = k_gmem // elems
    rows = r["num_threads"] // threads_per_row
    return {"overrun": rows > tile_m, "tile_m": tile_m, "k_block_size": k_block,
            "rows_per_copy_pass": rows, "threads_per_row": threads_per_row, "elems_per_copy": elems}


# ---------------------------------------------------------------------------------------------
# Note [Kernel variants], SM 10.x: the kernel objects FA4's own host code builds
# ---------------------------------------------------------------------------------------------
#: the SM 10.x forward / backward kernel classes whose configuration a variant key describes (the
#: pre/postprocess, varlen block-count and combine kernels follow from them)
SM100_MAIN_FWD = ("FlashAttentionForwardSm100", "FlashAttentionMLAForwardSm100", "FlashAttentionMLAForward1CtaSm100",
                  "FlashAttentionMLAForward1CtaKb64Sm100")
SM100_MAIN_BWD = ("FlashAttentionBackwardSm100", "BlackwellFusedMultiHeadAttentionBackward",
                  "FlashAttentionSparseMLABackwardSm100")


def _recorded_value(x: Any) -> Any:
    """A kernel object's attribute as plain data (enums by name, classes by name, other objects by
    their type's name)."""
    import enum
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {k: _recorded_value(v) for k, v in x.items()}
    if isinstance(x, enum.Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, type):
        return x.__name__
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in x):
        return tuple(x)
    return f"<{type(x).__name__}>"


class _AlwaysMiss(dict):
    """A JIT cache that always misses: FA4 builds (and hands ``cute.compile``) every kernel again;
    what it stores can be read back (the sparse MLA backward reads its entry after storing it)."""

    def __contains__(self, key: object) -> bool:
        return False


@contextlib.contextmanager
def recording_compiles():
    """Note [Kernel variants]: inside the block every ``cute.compile`` is recorded as ``(class
    name, attribute dict)`` of the kernel object FA4's host code built, and returns a no-op
    instead of compiling; FA4's JIT caches (``interface``'s ``compile_cache``) always miss, so a
    call builds its kernels again. Yields the list of records. ``cute.compile`` and the caches
    are restored on exit, also when the block raises. Nothing is traced or launched: run the
    calls under torch ``FakeTensorMode`` (FA4 skips the launch there)."""
    import cutlass.cute as cute
    from flash_attn.cute import interface
    records: list[tuple[str, dict]] = []

    def record(obj: Any, *_a: Any, **_k: Any):
        records.append((type(obj).__name__, {n: _recorded_value(v) for n, v in vars(obj).items()}))
        return lambda *_a, **_k: None

    fns = [f for f in (getattr(interface, n) for n in dir(interface)) if hasattr(f, "compile_cache")]
    saved = [(f, f.compile_cache) for f in fns]
    compile_ = cute.compile
    cute.compile = record
    try:
        for f in fns:
            f.compile_cache = _AlwaysMiss()
        yield records
    finally:
        cute.compile = compile_
        for f, cache in saved:
            f.compile_cache = cache


def _mask_mode(causal: bool, local: bool) -> str:
    return "local" if local else ("causal" if causal else "none")


def _sm100_ex2(a: dict) -> tuple[int, int]:
    """``(ex2_emu_freq, ex2_emu_start_frg)`` as ``FlashAttentionForwardSm100.__call__`` sets them at
    trace time for a 16-bit dtype (flash-attn-4 4.0.0b36, flash_fwd_sm100.py:550-557, mirrored: the
    recorder runs no ``__call__``); freq 0: every exp2 on MUFU. The fp8 override before them
    (:538-545) is not mirrored: the variants are keyed for 16-bit audits only."""
    tune = a.get("_tune") or {}
    start = tune.get("ex2_emu_start_frg", 1)
    if not a["enable_ex2_emu"]:
        return 0, start
    freq = tune.get("ex2_emu_freq", 16)
    if a["pack_gqa"] and a["head_dim_padded"] > 64 and not a["is_causal"] and not a["is_local"]:
        freq = 32 if a["is_varlen_q"] else tune.get("ex2_emu_freq", 10)
    return freq, start


#: the fields of :func:`sm100_fwd_variant_key` / :func:`sm100_bwd_variant_key` (FA4's kernel
#: classes): ``dict(zip(SM100_FWD_FIELDS, key))``
SM100_FWD_FIELDS = ("pass", "arch", "hd_padded", "hdv_padded", "hd_oob", "mode", "tile_m", "tile_n", "q_stage",
                    "two_cta", "s_ping_pong", "pack_gqa", "tma_q", "tma_o", "split_kv", "ex2_emu_freq",
                    "ex2_emu_start")
SM100_BWD_FIELDS = ("pass", "arch", "hd", "hdv", "hd_oob", "mode", "tile_m", "tile_n", "cta_schedule", "gqa",
                    "deterministic", "spt", "split_P_dS", "q_subtile", "kv_subtile")


def sm100_fwd_variant_key(cls: str, a: dict) -> Optional[tuple]:
    """The SM 10.x forward variant of a recorded kernel object (:func:`recording_compiles`): the
    padded head dims and whether their tail is predicated, mask mode, tile, q_stage (the second
    softmax warpgroup), 2-CTA, S ping-pong, PackGQA with TMA or cp.async Q, TMA or the
    correction-warp epilogue for O, split-KV, and the exp2-emulation share. The tile scheduler is
    left out (its code is orthogonal to the math; red-team round 14's coarse key). An MLA forward
    is keyed by its own host flags; None for any other class."""
    if cls == "FlashAttentionForwardSm100":
        freq, start = _sm100_ex2(a)
        return ("fwd", "sm100", a["head_dim_padded"], a["head_dim_v_padded"],
                bool(a["check_hdim_oob"] or a["check_hdim_v_oob"]), _mask_mode(a["is_causal"], a["is_local"]),
                a["m_block_size"], a["n_block_size"], a["q_stage"], a["use_2cta_instrs"], a["use_s_ping_pong"],
                a["pack_gqa"], a["use_tma_Q"], a["use_tma_O"], a["is_split_kv"], freq, start)
    if cls in SM100_MAIN_FWD:
        keep = ("is_causal", "pack_gqa", "is_topk_gather", "is_split_kv", "use_2cta_instrs", "use_cpasync_load_KV",
                "use_tma_KV", "rescale_threshold", "s_ahead", "pad_qheads", "use_clc_scheduler", "has_qk", "is_fp8")
        return ("fwd", cls) + tuple((k, a[k]) for k in keep if k in a)
    return None


def sm100_bwd_variant_key(cls: str, a: dict, *, gqa: bool, deterministic: bool) -> Optional[tuple]:
    """The SM 10.x backward variant of a recorded kernel object: head dims, tail predication, mask
    mode, tile, CTA schedule (1-CTA, 2-CTA pipelined, 2-CTA serial), GQA accumulation,
    deterministic, the semaphore order (``spt``), ``split_P_dS`` and the sparse subtile factors.
    ``gqa`` / ``deterministic``: the call's (the hd-256 kernel keeps neither as an attribute: GQA is
    in K's shape, determinism in the semaphores it is handed). None for any other class."""
    if cls == "FlashAttentionBackwardSm100":
        return ("bwd", "sm100", a["tile_hdim"], a["tile_hdimv"], bool(a["check_hdim_oob"] or a["check_hdim_v_oob"]),
                _mask_mode(a["is_causal"], a["is_local"]), a["tile_m"], a["tile_n"], a["cta_schedule"],
                a["qhead_per_kvhead"] > 1, a["deterministic"], a["spt_override"], a["split_P_dS"],
                a["q_subtile_factor"], a["kv_subtile_factor"])
    if cls == "BlackwellFusedMultiHeadAttentionBackward":
        local = a.get("window_size_left") is not None or a.get("window_size_right") is not None
        return ("bwd", "sm100_hd256", 256, 256, False, _mask_mode(a["is_causal"], local),
                a["tile_m_dkdv"], a["tile_n_dkdv"], "hd256_2cta", bool(gqa), bool(deterministic), None, False, 1, 1)
    if cls in SM100_MAIN_BWD:
        keep = ("is_causal", "pack_gqa", "is_topk_gather", "use_2cta_instrs", "rescale_threshold", "recompute_p")
        return ("bwd", cls, bool(deterministic)) + tuple((k, a[k]) for k in keep if k in a)
    return None
