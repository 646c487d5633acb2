"""Production FA4 adapter.

The one importer of ``flash_attn.cute`` for production kernels: every launch, compile, compile
cache, config, upstream reference (``attention_ref``) and compile-only shim of FA4's production
kernels goes through this module. (The other concerns have their own one importer:
FA4's parameters, :mod:`fa4verify.kernels.fa4_params`; FA4's device functions for the probe
kernels, :mod:`fa4verify.kernels.fa4_device`. ``tests/test_import_direction.py`` holds the table.)

It runs FlashAttention-4's public entry points (``flash_attn_func``, ``flash_attn_varlen_func``)
forward, and FA4's backward driver ``_flash_attn_bwd`` (the function the public autograd
backward calls; it is private but the only entry that accepts caller-provided ``dq/dk/dv``
output buffers, which the determinism checks need), with every public numeric feature: causal,
``window_size``, ``softcap``, ``learnable_sink``, GQA/MQA and ``pack_gqa``, varlen (zero-length
sequences included), ``deterministic`` and ``return_lse``.

Every call returns a :class:`CallConfig` that records exactly what ran: FA4, DSL, torch and
CUDA versions, the kernel family (``arch``), GPU name, FA4's own compile key for the call (read
from FA4's JIT cache lookup, field names parsed from FA4's source), the tile size, ``pack_gqa``
as resolved, 2-CTA on/off, the SM100 tuning-table key, and the share of exp2 evaluations that use
the polynomial emulation (from ``fa4verify.kernels.twin.emulated_columns``; 0 on SM90, whose
kernels have no emulation).

:func:`exp2_emulation_disabled` turns FA4's exp2 emulation off through the tuning-table recipe
(flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq): ``ex2_emu_freq = 0`` for every key, compile cache cleared before
and after.

Without CUDA every entry point raises :class:`NoCudaError` ("no CUDA device: <reason>"), except
in torch ``FakeTensorMode`` (compile-only use on the CPU, see ``fa4verify.compile.census``), where FA4
compiles and skips the launch. :func:`install_compile_only_shims` answers the two device queries
such a compile makes (the SM count of the persistent scheduler, torch's current device).
"""
from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import math
import os
import platform
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, NamedTuple, Optional

__all__ = [
    "compile_key", "compile_key_exprs", "read_compile_key_names",
    "NoCudaError", "UnsupportedByRelease", "AdapterRefusal", "ReleaseInterfaceError", "fa4_interface", "cuda_status", "versions", "CallConfig", "ForwardResult", "BackwardResult",
    "forward", "backward", "exp2_emulation_disabled", "exp2_emulation_enabled",
    "clear_compile_caches", "supported_head_dims", "upstream_reference", "timing_callable",
    "forward_backward_autograd", "combine", "block_sparse_tensors", "block_sparse_tensors_varlen",
    "sm90_bwd_sparse_block_size",
    "sm90_bwd_config", "MLAForwardResult", "MLABackwardResult", "mla_forward", "mla_backward",
    "mla_forward_backward_autograd",
]


class NoCudaError(RuntimeError):
    """Raised by every entry point when no usable CUDA device (or no FA4) is available."""


class UnsupportedByRelease(NotImplementedError):
    """The call asks for a feature whose keyword the installed FA4 release's function does not take
    (Note [One adapter for every release]): the feature is unsupported by this FA4 release, named;
    never a ``TypeError`` at the call."""

    def __init__(self, function: str, keyword: str, value: Any = None, why: Optional[str] = None):
        self.function, self.keyword = function, keyword
        v = _dist_version("flash-attn-4")
        why = why or f"{function} takes no {keyword}="
        super().__init__(f"{keyword}= unsupported by this FA4 release (flash-attn-4 {v}, {why}): the call "
                         f"asks for {keyword}={_short(value)}")


class AdapterRefusal(ValueError):
    """fa4verify's adapter refuses a call on purpose (an argument combination FA4 would silently
    misread, or one the adapter does not route): a named limit of fa4verify, not FA4's refusal."""


class ReleaseInterfaceError(RuntimeError):
    """The installed FA4 release lacks a function the adapter calls (renamed or removed): the
    adapter cannot drive this release. An error of fa4verify (Note [Blame], fa4verify.blame),
    never a finding about FA4."""


def _short(v: Any) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"<tensor {tuple(v.shape)} {v.dtype}>"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


# Note [One adapter for every release]
# ------------------------------------
# FA4's interface changes between releases (4.0.0b26 added ``learnable_sink`` to
# ``_flash_attn_bwd``; 4.0.0b32 ``gather_bwd_recompute_p``; docs/howto.md has the table). The
# adapter reaches FA4 only through :func:`fa4_interface` (``flash_attn.cute.interface``; tests put
# a fake older release there) and calls FA4's functions only through :func:`_call_fa4`, which
# reads the installed function's signature (``inspect.signature``) and passes only the keywords it
# takes. A keyword it does not take is dropped when its value asks for nothing (None, False,
# ``(None, None)``, or the neutral value of :data:`_NEUTRAL`); otherwise the call raises
# :class:`UnsupportedByRelease` naming the function and the keyword. A function the release does
# not have raises :class:`ReleaseInterfaceError`.

#: keyword -> the value that asks for no feature (a release without the keyword behaves so)
_NEUTRAL: dict[str, Any] = {"num_splits": 1, "softcap": 0.0, "deterministic": False,
                            "gather_bwd_recompute_p": False, "recompute_p": False}


def fa4_interface():
    """FA4's ``flash_attn.cute.interface`` module: the adapter's one view of FA4 (Note [One adapter
    for every release])."""
    from flash_attn.cute import interface

    from fa4verify.kernels import kernel_cache
    kernel_cache.install()          # Note [Kernel cache integrity]: before any kernel is loaded
    return interface


def _fa4_fn(name: str):
    """FA4's interface function ``name``; :class:`ReleaseInterfaceError` when this release lacks it."""
    fa = fa4_interface()
    fn = getattr(fa, name, None)
    if fn is None:
        raise ReleaseInterfaceError(
            f"fa4verify's adapter cannot drive this FA4 release (flash-attn-4 {_dist_version('flash-attn-4')}): "
            f"flash_attn.cute.interface has no {name} (renamed or removed)")
    return fn


def _asks_for_nothing(name: str, value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, tuple) and all(x is None for x in value):
        return True
    if name in _NEUTRAL and isinstance(value, (bool, int, float)):
        return value == _NEUTRAL[name]
    return False


@functools.lru_cache(maxsize=64)
def _parameters(fn) -> Optional[frozenset[str]]:
    """The keyword names ``fn`` takes; None when it takes any (``**kwargs``) or has no signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def _accepted_kwargs(fn, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``kwargs`` that ``fn`` takes (Note [One adapter for every release])."""
    try:
        params = _parameters(fn)
    except TypeError:                    # an unhashable callable: read it each time
        params = _parameters.__wrapped__(fn)
    if params is None:
        return dict(kwargs)
    out = {}
    for k, v in kwargs.items():
        if k in params:
            out[k] = v
        elif not _asks_for_nothing(k, v):
            raise UnsupportedByRelease(getattr(fn, "__name__", str(fn)), k, v)
    return out


def _fa4_scalars(values) -> tuple:
    """Aux scalars as FA4's kernels take them: ``cutlass.Float32`` each (FA4 4.0.0b36 + DSL 4.8.1
    do not compile a Python float there: Note [Runtime scalars], ``fa4verify/compile/census_aux.py``)."""
    import cutlass
    return tuple(cutlass.Float32(float(x)) for x in values)


def _call_fa4(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with only the keywords the installed release's ``fn`` takes."""
    return fn(*args, **_accepted_kwargs(fn, kwargs))


# Note [Sink dtype of a release]
# ------------------------------
# FA4 4.0.0b20 .. b25 take a ``learnable_sink`` in bfloat16 only (``_flash_attn_fwd`` asserts
# ``learnable_sink.dtype == torch.bfloat16``); 4.0.0b26 on take float16, bfloat16 or float32
# (``interface._LEARNABLE_SINK_DTYPES``). fa4verify's sinks are float32 holding bf16-exact values
# (``AttentionProblem.materialize``), so on an older release FA4's own assertion refused every sink
# call ("FA4 rejected the call": a feature the release has, never run). :func:`_release_sink` reads
# the dtypes from the installed release and hands FA4 the sink in the first one it takes that holds
# the values exactly; none: :class:`UnsupportedByRelease`, named.

@functools.lru_cache(maxsize=8)
def _sink_dtypes(interface) -> Optional[tuple]:
    """The ``learnable_sink`` dtypes ``interface`` (FA4's interface module) takes (Note [Sink dtype
    of a release]), or None when its source says nothing (the sink is passed as given)."""
    dts = getattr(interface, "_LEARNABLE_SINK_DTYPES", None)
    if dts is not None:
        return tuple(dts)
    import re
    try:
        with open(interface.__file__, encoding="utf-8") as f:
            src = f.read()
    except (OSError, TypeError, AttributeError):
        return None
    if re.search(r"learnable_sink\.dtype\s*==\s*torch\.bfloat16", src):
        import torch
        return (torch.bfloat16,)
    return None


def _release_sink(learnable_sink):
    """``learnable_sink`` in a dtype the installed release takes (Note [Sink dtype of a release])."""
    if learnable_sink is None:
        return None
    dts = _sink_dtypes(fa4_interface())
    if dts is None or learnable_sink.dtype in dts:
        return learnable_sink
    for dt in dts:
        conv = learnable_sink.to(dt)
        if _fake_mode_active():          # compile-only: no values to compare
            return conv
        import torch
        if torch.equal(conv.to(learnable_sink.dtype), learnable_sink):
            return conv
    names = ", ".join(str(d).replace("torch.", "") for d in dts)
    raise UnsupportedByRelease("_flash_attn_fwd", "learnable_sink", learnable_sink,
                               why=f"it takes a learnable_sink in {names} only, and the call's "
                                   f"{str(learnable_sink.dtype).replace('torch.', '')} sink does not "
                                   f"convert exactly")


# ----------------------------------------------------------------------------------------------
# environment
# ----------------------------------------------------------------------------------------------

def _fake_mode_active() -> bool:
    try:
        from torch._guards import active_fake_mode
        return active_fake_mode() is not None
    except Exception:  # pragma: no cover - very old torch
        return False


def cuda_status() -> tuple[bool, str]:
    """``(True, "<gpu name>, sm_XY")`` when a CUDA device and flash-attn-4 are usable, else
    ``(False, reason)``. Never raises."""
    try:
        import torch
    except Exception as e:  # pragma: no cover
        return False, f"torch not importable ({type(e).__name__}: {e})"
    try:
        if not torch.cuda.is_available():
            why = "torch.cuda.is_available() is False"
            if torch.version.cuda is None:
                why += f" (torch {torch.__version__} is a CPU build)"
            return False, why
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
    except Exception as e:
        return False, f"CUDA query failed ({type(e).__name__}: {e})"
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as e:
        return False, f"flash_attn.cute not importable ({type(e).__name__}: {e})"
    return True, f"{name}, sm_{major}{minor}"


def interface_module():
    """FA4's ``flash_attn.cute.interface`` module (the drivers the stage taps wrap,
    ``fa4verify.kernels.stage_taps``); imported here so this stays the only importer of
    ``flash_attn.cute``."""
    return fa4_interface()


def _require_cuda() -> None:
    if _fake_mode_active():
        return
    ok, reason = cuda_status()
    if not ok:
        raise NoCudaError(f"no CUDA device: {reason}")
    fa4_interface()                 # Note [Kernel cache integrity]: the cache hardened first


from fa4verify.kernels.facts import dist_version as _dist_version, resolve_causal_local_window  # noqa: E402
from fa4verify.kernels.facts import parsed_source as _facts_parsed_source  # noqa: E402


def versions() -> dict[str, Optional[str]]:
    """Versions (cached per process: the distribution metadata lookups cost ~1 ms)."""
    return dict(_versions_cached())


@functools.lru_cache(maxsize=1)
def _versions_cached() -> dict[str, Optional[str]]:
    """Versions of everything that determines FA4's numerics (JSON-able; None = unavailable).

    Keys: ``fa4`` (flash-attn-4), ``dsl`` (nvidia-cutlass-dsl), ``quack``, ``torch``,
    ``torch_cuda`` (CUDA torch was built with), ``cuda_driver`` (driver API version, e.g. "13.0"),
    ``gpu``, ``compute_capability``, ``python``.
    """
    out: dict[str, Optional[str]] = {
        "fa4": _dist_version("flash-attn-4"),
        "dsl": _dist_version("nvidia-cutlass-dsl"),
        "quack": _dist_version("quack-kernels"),
        "torch": None, "torch_cuda": None, "cuda_driver": None, "gpu": None,
        "compute_capability": None, "python": platform.python_version(),
    }
    try:
        import torch
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
            major, minor = torch.cuda.get_device_capability(0)
            out["compute_capability"] = f"{major}.{minor}"
            try:
                v = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
            except Exception:
                v = None
            if v is None:
                try:
                    import ctypes
                    lib = ctypes.CDLL("libcuda.so.1")
                    n = ctypes.c_int()
                    if lib.cuDriverGetVersion(ctypes.byref(n)) == 0:
                        v = n.value
                except Exception:
                    v = None
            if isinstance(v, int):
                out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return out


def supported_head_dims(arch: int) -> str:
    """FA4's head-dim support rule for a kernel family (90, 100), as text (flash_attn/cute/interface.py:121 _validate_head_dims)."""
    from fa4verify.kernels.facts import supported_head_dims_text
    return supported_head_dims_text("sm90" if arch // 10 == 9 else "sm100")


# ----------------------------------------------------------------------------------------------
# compile-key capture
# ----------------------------------------------------------------------------------------------

_KEY_NAMES: dict[str, list[list[str]]] = {}
_LOCK = threading.Lock()
_COMBINE_LOCK = threading.Lock()     # _capture_partials runs inside _record_keys (which holds _LOCK)


def compile_key(problem: Any) -> tuple:
    """What selects the FA4 kernels of an attention ``problem`` (any object with the fields and
    ``features()`` of fa4verify's AttentionProblem): arch, dtype, head dims, the GQA ratio, the
    mask kind (causal, which window sides, mask_mod, mods), softcap on/off, sink, varlen, the call
    form (paged with its page size, seqused_k, seqused_q, block sparsity, a named mask_mod, pack_gqa; an MLA
    call with what routes it to a kernel) and whether each
    sequence-length maximum fits one 128-wide tile (FA4's single-block backward). Not FA4's own
    key -- that also holds tiles and heuristics derived from these -- but close to it: problems
    with equal keys share their kernels, so the engine runs them in one worker (fa4verify.run)."""
    f = problem.features()
    c = problem.call
    call = None if c is None else (c.page_size, c.seqused_k, c.q_batched, c.block_size, c.mask_mod_fn,
                                   getattr(c, "seqused_q", False), getattr(c, "pack_gqa", None))
    if c is not None and getattr(c, "num_splits", 1) != 1:   # split-KV: its own kernels and the combine
        call += ("split_kv",)
    if c is not None and getattr(c, "qv_dim", 0):   # MLA: FA4 routes by tokens, batch and heads (_mla_1cta_route)
        call += (c.qv_dim, c.gather_topk, c.recompute_p, problem.batch, problem.seqlen_q, problem.nheads)
    wl, wr = problem.window_size
    return (f["arch"], f["dtype"], f["hdim"], problem.nheads // problem.nheads_kv, f["causal"],
            wl is not None, wr is not None, f["softcap"], f["sink"], f["varlen"], f["mask_mod"],
            problem.mods, call, problem.seqlen_q <= 128, problem.seqlen_k <= 128,
            problem.batch > 1 and not problem.varlen)


def _compile_key_names(fn) -> list[list[str]]:
    """Source text of each element of every ``compile_key = (...)`` tuple in ``fn`` (FA4's own
    cache keys), so a recorded key can be shown as ``{expression: value}``. A wrapper of FA4's
    function (``__wrapped__``: the scratch guard's) is read as the function it wraps."""
    fn = inspect.unwrap(fn)
    name = f"{fn.__module__}.{fn.__qualname__}"
    if name not in _KEY_NAMES:
        path = inspect.getsourcefile(fn)
        if path is None:
            raise OSError(f"no source file for {fn!r}")
        by_line, _by_name, lines = _facts_parsed_source(path)
        node = by_line.get(fn.__code__.co_firstlineno)
        if node is None:
            raise OSError(f"{fn.__qualname__} not found at {path}:{fn.__code__.co_firstlineno}")
        _KEY_NAMES[name] = _key_tuples(node, lines)
    return _KEY_NAMES[name]


def compile_key_exprs(path: str, function: str) -> list[list[str]]:
    """The ``compile_key = (...)`` tuples of the module-level ``function`` in the source file
    ``path`` (each element's source text, whitespace collapsed); [] when it has none."""
    _by_line, by_name, lines = _facts_parsed_source(str(path))
    node = by_name.get(function)
    return [] if node is None else _key_tuples(node, lines)


def _key_tuples(node: ast.AST, lines: list[bytes]) -> list[list[str]]:
    found = []
    for n in ast.walk(node):
        if (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "compile_key"
                and isinstance(n.value, ast.Tuple)):
            found.append([" ".join(_segment(lines, e).split()) for e in n.value.elts])
    return found


def read_compile_key_names() -> int:
    """Parse the key names of every FA4 entry point with a compile cache now (the worker
    zygote does, so each forked worker inherits them instead of parsing on its first call);
    the number of entry points read."""
    mod = fa4_interface()
    fns = [f for f in vars(mod).values() if callable(f) and hasattr(f, "compile_cache")]
    for f in fns:
        try:
            _compile_key_names(f)
        except (OSError, TypeError, SyntaxError):      # no source here: read at the first call
            pass
    return len(fns)


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """The source text of ``node`` (what ``ast.get_source_segment`` returns) from the source's
    lines as bytes (:func:`fa4verify.kernels.facts.parsed_source`): ``get_source_segment`` splits the whole source again
    for every node, which cost ~0.7 s per FA4 entry point and process (FA4's `_flash_attn_fwd`
    has ~70 key elements; measured on this CPU)."""
    l0, l1 = node.lineno - 1, node.end_lineno - 1          # col offsets count UTF-8 bytes
    c0, c1 = node.col_offset, node.end_col_offset
    if l0 == l1:
        return lines[l0][c0:c1].decode()
    return (lines[l0][c0:] + b"".join(lines[l0 + 1:l1]) + lines[l1][:c1]).decode()


class _KeyRecorder:
    """Wraps one of FA4's JIT caches and remembers the key of each lookup (FA4 checks
    ``key in cache`` before compiling or calling)."""

    def __init__(self, inner):
        self.inner = inner
        self.keys: list[tuple] = []

    def __contains__(self, key) -> bool:
        self.keys.append(key)
        return key in self.inner

    def __getitem__(self, key):
        return self.inner[key]

    def __setitem__(self, key, value) -> None:
        self.inner[key] = value

    def clear(self) -> None:
        self.inner.clear()

    def __getattr__(self, name):
        return getattr(self.inner, name)


@contextlib.contextmanager
def _record_keys(fn) -> Iterator[_KeyRecorder]:
    with _LOCK:
        if not hasattr(fn, "compile_cache"):     # a release without an in-process cache here
            yield _KeyRecorder({})
            return
        orig = fn.compile_cache
        rec = _KeyRecorder(orig)
        fn.compile_cache = rec
        try:
            yield rec
        finally:
            fn.compile_cache = orig


class _Partials:
    """What :func:`_capture_partials` copied (None until FA4 calls its combine)."""
    value: Any = None


@contextlib.contextmanager
def _capture_partials(active: bool) -> Iterator[_Partials]:
    """Copy the partials a split-KV forward hands to FA4's internal combine
    (``interface._flash_attn_fwd_combine(out_partial, lse_partial, ...)``, 4.0.0b36: called from
    ``_flash_attn_fwd`` through the module global), then run the combine unchanged. The copy is
    queued on the stream before the combine, so it holds exactly what the combine reads."""
    got = _Partials()
    fa = fa4_interface() if active else None
    orig = getattr(fa, "_flash_attn_fwd_combine", None) if fa is not None else None
    if orig is None:
        yield got
        return

    @functools.wraps(orig)
    def tap(out_partial, lse_partial, *args, **kw):
        got.value = (out_partial.clone(), lse_partial.clone())
        return orig(out_partial, lse_partial, *args, **kw)

    with _COMBINE_LOCK:
        fa._flash_attn_fwd_combine = tap
        try:
            yield got
        finally:
            fa._flash_attn_fwd_combine = orig


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return repr(v)


def _named_key(fn, key: Optional[tuple]) -> Optional[dict[str, Any]]:
    if key is None:
        return None
    try:
        known = _compile_key_names(fn)
    except (OSError, TypeError, SyntaxError, ValueError):    # no readable source: positions only
        known = []
    for names in known:
        if len(names) == len(key):
            return {n: _jsonable(v) for n, v in zip(names, key)}
    return {f"[{i}]": _jsonable(v) for i, v in enumerate(key)}


# ----------------------------------------------------------------------------------------------
# configuration record
# ----------------------------------------------------------------------------------------------

@dataclass
class CallConfig:
    """Exactly what one adapter call ran. All fields JSON-able; see :meth:`to_dict`.

    ``emulated_share`` is the fraction (0..1) of exp2 evaluations per KV tile that use FA4's
    degree-3 polynomial (``twin.emulated_columns(...).mean()``); 0.0 on the SM90 kernels.
    ``compile_key`` is FA4's own compile-cache key as ``{source expression: value}``.
    """
    op: str                                  # "forward" | "backward"
    entry: str                               # FA4 function called
    versions: dict
    arch: int                                # kernel family FA4 dispatched to (90, 100, ...)
    gpu_name: Optional[str]
    dtype: str
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    softmax_scale: float                     # resolved (default 1/sqrt(head_dim))
    causal: bool
    window_size: tuple
    softcap: float
    learnable_sink: bool
    pack_gqa_requested: Optional[bool]
    varlen: bool
    deterministic: bool
    return_lse: bool
    compile_key: Optional[dict] = None
    tile_mn: Optional[tuple] = None
    pack_gqa: Optional[bool] = None
    use_2cta: Optional[bool] = None
    tuning_key: Optional[tuple] = None       # SM100: (use_2cta, causal, hd_pad, is_sm103)
    exp2_emulation: str = ""
    emulated_share: Optional[float] = None
    emulated_columns: Optional[list] = None
    emulated_share_source: str = ""
    env: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: features beyond the dense call: ``page_size``/``num_pages`` (paged KV), ``seqused_q``/
    #: ``seqused_k`` (bool), ``num_splits`` (requested), ``block_sparse`` (bool), ``combine``
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: _jsonable(v) if not isinstance(v, dict) else {kk: _jsonable(vv) for kk, vv in v.items()}
                for k, v in d.items()}


class ForwardResult(NamedTuple):
    out: Any            # torch tensor, input dtype, (b, s, h, dv) or (total, h, dv)
    lse: Any            # fp32 natural-log LSE, (b, h, s) or (h, total); None if not requested
    config: CallConfig
    #: a split-KV call's fp32 partials as FA4 handed them to its combine kernel, copied there:
    #: ``(out_partial (S, b, s, h, dv), lse_partial (S, b, s, h))`` (:func:`_capture_partials`); else None
    partials: Any = None


class BackwardResult(NamedTuple):
    dq: Any
    dk: Any
    dv: Any
    dsink: Any          # None without learnable_sink
    config: CallConfig


_ENV_KNOBS = ("FA_DISABLE_2CTA", "FA_CLC", "FLASH_ATTENTION_ARCH", "FLASH_ATTENTION_NUM_SMS",
              "CUTE_DSL_ARCH", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FA_LOG_LEVEL")

_EMULATION_DISABLED = False


def _device_arch() -> int:
    return int(_fa4_fn("_get_device_arch")())


def _gpu_name() -> Optional[str]:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return None


def _fill_kernel_fields(cfg: CallConfig, key: Optional[dict], *, head_dim: int, head_dim_v: int,
                        local: bool, varlen_q: bool) -> None:
    """Derive tile, pack_gqa, 2-CTA, tuning key and emulated share from FA4's compile key."""
    cfg.compile_key = key
    if key is not None:
        tm, tn = key.get("tile_m"), key.get("tile_n")
        if tm is not None:
            cfg.tile_mn = (tm, tn)
        cfg.pack_gqa = key.get("pack_gqa")
        cfg.use_2cta = key.get("use_2cta_instrs", key.get("use_2cta"))
    arch = cfg.arch
    if arch // 10 == 9:
        cfg.use_2cta = False if cfg.use_2cta is None else cfg.use_2cta
        cfg.tuning_key = None
        cfg.exp2_emulation = "none (SM90 kernels: hardware ex2.approx.ftz only)"
        cfg.emulated_share, cfg.emulated_columns = 0.0, []
        cfg.emulated_share_source = "SM90 has no exp2 emulation (flash_attn/cute/softmax.py:187 Softmax.online_softmax)"
        return
    if arch // 10 not in (10, 11) or cfg.op != "forward":
        cfg.exp2_emulation = ("none (backward recomputes P with hardware exp2 only)"
                              if cfg.op == "backward" else f"unknown for arch {arch}")
        cfg.emulated_share = 0.0 if cfg.op == "backward" else None
        cfg.emulated_share_source = "flash_attn/cute/flash_bwd_preprocess.py / flash_bwd_postprocess.py" if cfg.op == "backward" else ""
        return
    hd_pad = int(math.ceil(head_dim / 16) * 16)
    is_sm103 = arch == 103 or (arch // 10 == 10 and arch % 10 >= 3)
    cfg.tuning_key = (bool(cfg.use_2cta), bool(cfg.causal), hd_pad, bool(is_sm103))
    if _EMULATION_DISABLED:
        cfg.exp2_emulation = "disabled by fa4verify (tuning-table recipe, ex2_emu_freq=0)"
        cfg.emulated_share, cfg.emulated_columns = 0.0, []
        cfg.emulated_share_source = "adapter.exp2_emulation_disabled()"
        return
    cfg.exp2_emulation = "FA4 default (tuning table)"
    try:
        from fa4verify.kernels import twin
        cols = twin.emulated_columns(head_dim=head_dim, head_dim_v=head_dim_v, causal=cfg.causal,
                                     local=local, pack_gqa=bool(cfg.pack_gqa), varlen_q=varlen_q,
                                     use_2cta=cfg.use_2cta, is_sm103=is_sm103, fp8=False,
                                     n_block_size=int(cfg.tile_mn[1]) if cfg.tile_mn else 128)
        import numpy as np
        cols = np.asarray(cols, dtype=bool)
        cfg.emulated_columns = [int(i) for i in np.flatnonzero(cols)]
        cfg.emulated_share = float(cols.mean()) if cols.size else 0.0
        cfg.emulated_share_source = "fa4verify.kernels.twin.emulated_columns"
    except Exception as e:  # twin not written yet, or a config it does not model
        cfg.emulated_share = None
        cfg.emulated_share_source = f"unavailable ({type(e).__name__}: {e})"


def _base_config(op: str, entry: str, q, k, v, *, softmax_scale, causal, window_size, softcap,
                 learnable_sink, pack_gqa, varlen, deterministic, return_lse) -> CallConfig:
    head_dim = int(q.shape[-1])
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    return CallConfig(
        op=op, entry=entry, versions=versions(), arch=_device_arch(), gpu_name=_gpu_name(),
        dtype=str(q.dtype).replace("torch.", ""), q_shape=tuple(q.shape), k_shape=tuple(k.shape),
        v_shape=tuple(v.shape), softmax_scale=scale, causal=bool(causal),
        window_size=tuple(window_size) if window_size is not None else (None, None),
        softcap=float(softcap or 0.0), learnable_sink=learnable_sink is not None,
        pack_gqa_requested=pack_gqa, varlen=varlen, deterministic=bool(deterministic),
        return_lse=bool(return_lse),
        env={k_: os.environ[k_] for k_ in _ENV_KNOBS if k_ in os.environ},
    )


def _check_mods(mask_mod, causal, window_size) -> None:
    ws = tuple(window_size) if window_size is not None else (None, None)
    if mask_mod is not None and (causal or ws != (None, None)):
        raise AdapterRefusal("mask_mod with causal/window_size: FA4 silently drops causal and the window "
                         "when a mask_mod is given (_resolve_causal_local_window); write them into the mask_mod")


def _check_varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> bool:
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise AdapterRefusal("varlen needs both cu_seqlens_q and cu_seqlens_k (int32, (batch+1,))")
    return varlen


# ----------------------------------------------------------------------------------------------
# entry points
# ----------------------------------------------------------------------------------------------

def forward(q, k, v, *, softmax_scale: Optional[float] = None, causal: bool = False,
            window_size: tuple = (None, None), softcap: float = 0.0, learnable_sink=None,
            pack_gqa: Optional[bool] = None, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
            return_lse: bool = True, page_table=None, seqused_q=None, seqused_k=None,
            num_splits: int = 1, block_sparse_tensors=None, mask_mod=None, score_mod=None,
            aux_tensors=None, aux_scalars=None, q_descale=None, k_descale=None,
            v_descale=None, causal_with_mask_mod: bool = False) -> ForwardResult:
    """Run FA4's forward on CUDA tensors (fp16/bf16; layout (batch, seqlen, nheads, headdim), or
    (total, nheads, headdim) with ``cu_seqlens_q/k`` for varlen).

    Calls ``flash_attn_func`` or ``flash_attn_varlen_func`` under ``torch.no_grad()`` (inputs are
    used as given; gradients are the job of :func:`backward`). ``lse`` is FA4's fp32
    natural-log LSE, shape (batch, nheads, seqlen_q) or (nheads, total_q).

    Paged KV: ``page_table`` (int32, (batch, max_pages_per_seq)) with ``k``/``v`` as pages
    (num_pages, page_size, nheads_kv, d) and usually ``seqused_k`` (int32, (batch,)): token ``j``
    of sequence ``b`` is ``k[page_table[b, j // page_size], j % page_size]``
    (``fa4verify.oracles.paged_kv``); not with ``cu_seqlens_k`` (FA4 asserts). ``seqused_q`` /
    ``seqused_k`` alone limit the used rows of batched q / k. Any of them routes the call to
    ``flash_attn_varlen_func`` (the only public entry that takes them; it accepts batched q).
    ``num_splits`` is FA4's split-KV knob (1 = off; SM90 asserts on > 1).
    ``block_sparse_tensors``: FA4's ``BlockSparseTensorsTorch`` (per Q block its KV blocks;
    :func:`block_sparse_tensors` with ``direction="fwd"``). ``mask_mod``: an FA4 CuTe DSL mask
    callable (``fa4verify.kernels.mask_mods``, ``fa4verify.kernels.mods``), passed through;
    ``score_mod`` likewise (FA4 applies it to the scaled score, ``kernels/mods.py``);
    ``aux_tensors``: the CUDA tensors both read; ``aux_scalars``: their runtime scalars (floats,
    handed to FA4 as ``cutlass.Float32``: :func:`_fa4_scalars`). A mask_mod makes FA4 ignore
    ``causal`` and ``window_size`` (``_resolve_causal_local_window``): they are refused here with
    a mask_mod, unless ``causal_with_mask_mod`` asks to pass ``causal=True`` along on purpose (FA4's
    forward then drops it; its backward must too: the ``mask_causal`` call form).
    ``q_descale`` / ``k_descale`` / ``v_descale``: fp32 (batch, nheads_kv) factors of fp8 inputs
    (e4m3/e5m2; SM 10.x only): the logits are ``scale * (q_descale q) . (k_descale k)`` and the
    output ``P (v_descale v)`` (``fa4verify.oracles.descale``); FA4's public functions do not take
    them, so fp8 and descale calls go to ``interface._flash_attn_fwd`` (recorded as ``entry``).

    Raises :class:`NoCudaError` without a usable CUDA device (unless in FakeTensorMode).
    """
    _require_cuda()
    import torch
    if not causal_with_mask_mod:
        _check_mods(mask_mod, causal, window_size)
    learnable_sink = _release_sink(learnable_sink)
    mods = {} if score_mod is None and aux_tensors is None else {"score_mod": score_mod, "aux_tensors": aux_tensors}
    if aux_scalars:
        mods["aux_scalars"] = _fa4_scalars(aux_scalars)
    descale = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    fp8 = str(q.dtype).startswith("torch.float8")
    if fp8 or any(t is not None for t in descale.values()):
        if mods:
            raise AdapterRefusal("score_mod / aux_tensors / aux_scalars with fp8 or descale inputs are not routed by "
                             "the adapter (FA4's private entry takes them; not audited yet)")
        return _forward_private(q, k, v, None, softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                                pack_gqa=pack_gqa, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                return_lse=return_lse, page_table=page_table, seqused_q=seqused_q,
                                seqused_k=seqused_k, num_splits=num_splits,
                                block_sparse_tensors=block_sparse_tensors, mask_mod=mask_mod,
                                gather_kv_indices=None, requires_grad=False,
                                gather_bwd_recompute_p=False, **descale)[0]
    paged = page_table is not None
    if paged and cu_seqlens_k is not None:
        raise AdapterRefusal("page_table cannot be combined with cu_seqlens_k (FA4: batched pages only)")
    if paged or seqused_q is not None or seqused_k is not None:
        # FA4 takes batched Q over K/V packed at capacity offsets (cu_seqlens_k without cu_seqlens_q:
        # interface.py sizes the batch from cu_seqlens_k's length then)
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        use_varlen_entry = True
    else:
        varlen = _check_varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        use_varlen_entry = varlen
    if int(num_splits) < 1 and int(num_splits) != 0:
        raise AdapterRefusal(f"num_splits must be >= 1 (or 0: FA4's heuristic), got {num_splits}")
    entry = "flash_attn_varlen_func" if use_varlen_entry else "flash_attn_func"
    cfg = _base_config("forward", entry, q, k, v, softmax_scale=softmax_scale, causal=causal,
                       window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                       pack_gqa=pack_gqa, varlen=varlen, deterministic=False,
                       return_lse=return_lse)
    cfg.extra = {"paged": paged, "page_size": int(k.shape[1]) if paged else None,
                 "num_pages": int(k.shape[0]) if paged else None,
                 "seqused_q": seqused_q is not None, "seqused_k": seqused_k is not None,
                 "num_splits": int(num_splits), "block_sparse": block_sparse_tensors is not None,
                 "mask_mod": getattr(mask_mod, "__name__", None) if mask_mod is not None else None,
                 "score_mod": getattr(score_mod, "__name__", None) if score_mod is not None else None,
                 "aux_tensors": len(aux_tensors) if aux_tensors else 0,
                 "aux_scalars": len(aux_scalars) if aux_scalars else 0}
    ws = tuple(window_size) if window_size is not None else (None, None)
    fwd_fn = _fa4_fn("_flash_attn_fwd")
    public = _fa4_fn(entry)
    with _record_keys(fwd_fn) as rec, _capture_partials(int(num_splits) != 1) as parts, torch.no_grad():
        if use_varlen_entry:
            out, lse = _call_fa4(
                public, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_q=seqused_q,
                seqused_k=seqused_k, page_table=page_table, softmax_scale=softmax_scale,
                causal=causal, window_size=ws, learnable_sink=learnable_sink, softcap=softcap,
                num_splits=int(num_splits), pack_gqa=pack_gqa, return_lse=return_lse,
                block_sparse_tensors=block_sparse_tensors, mask_mod=mask_mod, **mods)
        else:
            out, lse = _call_fa4(
                public, q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=ws,
                learnable_sink=learnable_sink, softcap=softcap, pack_gqa=pack_gqa,
                num_splits=int(num_splits), return_lse=return_lse,
                block_sparse_tensors=block_sparse_tensors, mask_mod=mask_mod, **mods)
    key = rec.keys[-1] if rec.keys else None
    if key is None:
        cfg.notes.append("no kernel launched (empty input: FA4 fills out=0, lse=-inf/sink)")
    _, local, _, _ = resolve_causal_local_window(causal, ws)
    _fill_kernel_fields(cfg, _named_key(fwd_fn, key), head_dim=int(q.shape[-1]),
                        head_dim_v=int(v.shape[-1]), local=local, varlen_q=cu_seqlens_q is not None or seqused_q is not None)
    if parts.value is not None:
        cfg.extra["num_splits_run"] = int(parts.value[0].shape[0])
    return ForwardResult(out, lse, cfg, parts.value)


def backward(q, k, v, out, dout, lse, *, softmax_scale: Optional[float] = None,
             causal: bool = False, window_size: tuple = (None, None), softcap: float = 0.0,
             learnable_sink=None, pack_gqa: Optional[bool] = None, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
             max_seqlen_k: Optional[int] = None, deterministic: bool = False,
             dq=None, dk=None, dv=None, dlse=None, block_sparse_tensors=None,
             seqused_q=None, seqused_k=None, score_mod=None, score_mod_bwd=None, mask_mod=None,
             aux_tensors=None, aux_scalars=None, causal_with_mask_mod: bool = False) -> BackwardResult:
    """Run FA4's backward (``flash_attn.cute.interface._flash_attn_bwd``, what the public
    autograd backward of ``flash_attn_func``/``flash_attn_varlen_func`` calls).

    ``out`` and ``lse`` must come from :func:`forward` with the same features. ``dq/dk/dv``,
    when given, are the output buffers FA4 writes (shapes/dtypes of q/k/v; e.g. views into
    guard-banded allocations); otherwise FA4 allocates them. ``pack_gqa`` is recorded only:
    FA4's backward never packs GQA (flash_attn/cute/flash_bwd_preprocess.py / flash_bwd_postprocess.py). ``dsink`` is returned with a
    ``learnable_sink``, else None. ``block_sparse_tensors``: FA4's
    ``BlockSparseTensorsTorch`` in the backward's Q-direction form (per KV block, the Q blocks it
    sees; ``fa4verify.kernels.block_sparse.to_fa4_bwd``); not with varlen (FA4 asserts).
    ``seqused_q`` / ``seqused_k`` (int32, (batch,)): the used rows of batched q / k, as in
    :func:`forward` (FA4's ``_flash_attn_bwd`` takes them; not with block sparsity).
    ``score_mod`` + ``score_mod_bwd`` (FA4 requires both), ``mask_mod``, ``aux_tensors``,
    ``aux_scalars``: as in :func:`forward` (the same callables, tensors and scalars the forward ran
    with); ``causal_with_mask_mod`` as in :func:`forward`.

    Raises :class:`NoCudaError` without a usable CUDA device (unless in FakeTensorMode).
    """
    _require_cuda()
    import torch
    if seqused_q is not None or seqused_k is not None:
        # as in forward: packed or batched Q, K/V batched or packed at capacity offsets, limited
        # by seqused_k
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    else:
        varlen = _check_varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not causal_with_mask_mod:
        _check_mods(mask_mod, causal, window_size)
    learnable_sink = _release_sink(learnable_sink)
    if score_mod is not None and score_mod_bwd is None:
        raise AdapterRefusal("backward with a score_mod needs its score_mod_bwd (FA4 asserts)")
    cfg = _base_config("backward", "_flash_attn_bwd", q, k, v, softmax_scale=softmax_scale,
                       causal=causal, window_size=window_size, softcap=softcap,
                       learnable_sink=learnable_sink, pack_gqa=pack_gqa, varlen=varlen,
                       deterministic=deterministic, return_lse=dlse is not None)
    cfg.extra = {"block_sparse": block_sparse_tensors is not None,
                 "mask_mod": getattr(mask_mod, "__name__", None) if mask_mod is not None else None,
                 "score_mod": getattr(score_mod, "__name__", None) if score_mod is not None else None,
                 "aux_tensors": len(aux_tensors) if aux_tensors else 0,
                 "aux_scalars": len(aux_scalars) if aux_scalars else 0,
                 "block_size": (list(block_sparse_tensors.block_size)
                                if getattr(block_sparse_tensors, "block_size", None) else None),
                 "seqused_q": seqused_q is not None, "seqused_k": seqused_k is not None}
    ws = tuple(window_size) if window_size is not None else (None, None)
    for name, buf, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if buf is not None and (tuple(buf.shape) != tuple(ref.shape) or buf.dtype != ref.dtype):
            raise AdapterRefusal(f"{name} buffer must have shape {tuple(ref.shape)} and dtype {ref.dtype}, "
                             f"got {tuple(buf.shape)} {buf.dtype}")
    bwd_fn = _fa4_fn("_flash_attn_bwd")
    with _record_keys(bwd_fn) as rec, torch.no_grad():
        res = _call_fa4(
            bwd_fn, q, k, v, out, dout, lse, softmax_scale, causal, softcap,
            window_size_left=ws[0], window_size_right=ws[1],
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            seqused_q=seqused_q, seqused_k=seqused_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            deterministic=deterministic, dq=dq, dk=dk, dv=dv, dlse=dlse,
            learnable_sink=learnable_sink, block_sparse_tensors=block_sparse_tensors,
            score_mod=score_mod, score_mod_bwd=score_mod_bwd, mask_mod=mask_mod, aux_tensors=aux_tensors,
            **({"aux_scalars": _fa4_scalars(aux_scalars)} if aux_scalars else {}))
    if learnable_sink is None:
        gdq, gdk, gdv = res
        dsink = None
    else:
        gdq, gdk, gdv, dsink = res
    key = rec.keys[-1] if rec.keys else None
    if key is None:
        cfg.notes.append("no kernel launched (empty input: FA4 zero-fills the gradients)")
    _, local, _, _ = resolve_causal_local_window(causal, ws)
    _fill_kernel_fields(cfg, _named_key(bwd_fn, key), head_dim=int(q.shape[-1]),
                        head_dim_v=int(v.shape[-1]), local=local, varlen_q=cu_seqlens_q is not None or seqused_q is not None)
    return BackwardResult(gdq, gdk, gdv, dsink, cfg)


class MLAForwardResult(NamedTuple):
    out: Any            # (b, s, h, 512) or (total, h, 512); bf16 (fp8 inputs: bf16)
    lse: Any            # fp32 natural-log LSE in FA4's MLA layout (b, s, h) or (total, h); None
    p: Any              # sparse MLA training: saved P (b, s, h, topk) for the backward, else None
    row_max: Any        # sparse MLA training: per-128-key-block row max, else None
    o_lo: Any           # sparse MLA training: fp32(O) - bf16(O) residual, else None
    config: CallConfig


class MLABackwardResult(NamedTuple):
    dq: Any             # like q (None when q is None)
    dk: Any             # like k (None when k is None)
    dv: Any             # like v: both uses of the latent V (score and value)
    dqv: Any            # like qv
    dsink: Any
    config: CallConfig


def _mla_scale(q, qv, v, softmax_scale) -> float:
    """FA4's default MLA scale (``interface._flash_attn_fwd``): ``1/sqrt(head_dim + head_dim_v)``
    with q and qv, ``1/sqrt(head_dim)`` of the tensor in q's place otherwise."""
    if softmax_scale is not None:
        return float(softmax_scale)
    if qv is None or q is None:
        return 1.0 / math.sqrt(int((q if q is not None else qv).shape[-1]))
    return 1.0 / math.sqrt(int(q.shape[-1]) + int(v.shape[-1]))


def _forward_private(q, k, v, qv, *, softmax_scale, causal, window_size, softcap, learnable_sink,
                     pack_gqa, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_lse,
                     page_table, seqused_q, seqused_k, num_splits, block_sparse_tensors, mask_mod,
                     gather_kv_indices, requires_grad, gather_bwd_recompute_p, q_descale, k_descale,
                     v_descale) -> tuple[ForwardResult, Any, Any, Any]:
    """``interface._flash_attn_fwd`` with every feature argument (MLA, gather, descales):
    (ForwardResult, p, row_max, o_lo)."""
    import torch
    learnable_sink = _release_sink(learnable_sink)
    if int(num_splits) < 1 and int(num_splits) != 0:
        raise AdapterRefusal(f"num_splits must be >= 1 (or 0: FA4's heuristic), got {num_splits}")
    if gather_kv_indices is not None and qv is None:
        raise AdapterRefusal("gather_kv_indices needs qv (FA4: sparse MLA only)")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    ref = q if q is not None else qv
    kref = k if k is not None else v
    cfg = _base_config("forward", "_flash_attn_fwd", ref, kref, v, softmax_scale=softmax_scale,
                       causal=causal, window_size=window_size, softcap=softcap,
                       learnable_sink=learnable_sink, pack_gqa=pack_gqa, varlen=varlen,
                       deterministic=False, return_lse=return_lse)
    if qv is not None:
        cfg.softmax_scale = _mla_scale(q, qv, v, softmax_scale)
    paged = page_table is not None
    cfg.extra = {"paged": paged, "page_size": int(v.shape[1]) if paged else None,
                 "seqused_q": seqused_q is not None, "seqused_k": seqused_k is not None,
                 "num_splits": int(num_splits), "block_sparse": block_sparse_tensors is not None,
                 "mask_mod": getattr(mask_mod, "__name__", None) if mask_mod is not None else None,
                 "mla": qv is not None, "qv_shape": list(qv.shape) if qv is not None else None,
                 "has_qk": q is not None and k is not None,
                 "head_dim_v": int(v.shape[-1]),
                 "gather_kv_indices": (list(gather_kv_indices.shape) if gather_kv_indices is not None
                                       else None),
                 "gather_bwd_recompute_p": bool(gather_bwd_recompute_p),
                 "requires_grad": bool(requires_grad),
                 "q_descale": q_descale is not None, "k_descale": k_descale is not None,
                 "v_descale": v_descale is not None,
                 "kv_descale_shared": k_descale is not None and k_descale is v_descale}

    def grad(t):
        return None if t is None else (t.detach().requires_grad_(True) if requires_grad else t)
    ws = tuple(window_size) if window_size is not None else (None, None)
    fwd_fn = _fa4_fn("_flash_attn_fwd")
    with _record_keys(fwd_fn) as rec, _capture_partials(int(num_splits) != 1) as parts, torch.no_grad():
        res = _call_fa4(
            fwd_fn, grad(q), grad(k), grad(v), qv=grad(qv), cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q, seqused_k=seqused_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, page_table=page_table,
            softmax_scale=softmax_scale, causal=causal, softcap=softcap,
            window_size_left=ws[0], window_size_right=ws[1], learnable_sink=learnable_sink,
            num_splits=int(num_splits), pack_gqa=pack_gqa, mask_mod=mask_mod,
            block_sparse_tensors=block_sparse_tensors, return_lse=return_lse,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            gather_kv_indices=gather_kv_indices, gather_bwd_recompute_p=gather_bwd_recompute_p)
    # (out, lse, p, row_max, o_lo) since 4.0.0b33 (o_lo added); (out, lse, p, row_max) before
    out, lse, p, row_max = res[:4]
    o_lo = res[4] if len(res) > 4 else None
    key = rec.keys[-1] if rec.keys else None
    if key is None:
        cfg.notes.append("no kernel launched (empty input: FA4 fills out=0, lse=-inf/sink)")
    _, local, _, _ = resolve_causal_local_window(causal, ws)
    named = _named_key(fwd_fn, key)
    if qv is None:
        _fill_kernel_fields(cfg, named, head_dim=int(ref.shape[-1]), head_dim_v=int(v.shape[-1]),
                            local=local, varlen_q=cu_seqlens_q is not None or seqused_q is not None)
    else:
        cfg.compile_key = named
        if named is not None:
            cfg.tile_mn = (named.get("tile_m"), named.get("tile_n"))
            cfg.use_2cta = named.get("use_2cta_instrs", named.get("use_2cta"))
            cfg.extra["mla_1cta"] = named.get("mla_1cta")
        cfg.exp2_emulation = "MLA kernel (flash_fwd_mla_*_sm100.py): not modelled by the twin"
        cfg.emulated_share = None
        cfg.emulated_share_source = "not modelled (MLA kernels)"
    if parts.value is not None:
        cfg.extra["num_splits_run"] = int(parts.value[0].shape[0])
    return ForwardResult(out, lse, cfg, parts.value), p, row_max, o_lo


def mla_forward(q, k, v, qv, *, gather_kv_indices=None, softmax_scale: Optional[float] = None,
                causal: bool = False, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None,
                seqused_k=None, max_seqlen_q: Optional[int] = None,
                max_seqlen_k: Optional[int] = None, page_table=None, num_splits: int = 1,
                q_descale=None, k_descale=None, v_descale=None, learnable_sink=None,
                return_lse: bool = True, for_backward: bool = False,
                gather_bwd_recompute_p: bool = False) -> MLAForwardResult:
    """FA4's MLA forward (``qv``; SM 10.x/11.x only): ``q`` (b, s, h, 64) rope part, ``k``
    (b, sk, hk, 64), ``v`` (b, sk, hk, 512) the latent cache, ``qv`` (b, s, h, 512); the logits are
    ``scale * (q . k_j + qv . v_j)`` and ``O = P V`` (``fa4verify.oracles.mla``); default scale
    ``1/sqrt(64 + 512)``. ``q``/``k`` may be None (no rope part: logits ``scale qv . v_j``).

    ``gather_kv_indices`` (int32, (b, s, topk), topk % 128 == 0; FA4: one KV head): top-k sparse
    MLA, query token ``(b, i)`` sees the key slots listed for it; ``-1`` (or an index outside
    ``[0, seqlen_k)``, or past the causal limit ``i + 1 + seqlen_k - seqlen_q``) is an empty slot.
    ``for_backward`` makes FA4 see inputs that require grad (detached views with
    ``requires_grad``; the caller's tensors are not changed), so it saves ``p``/``row_max``/``o_lo``
    for :func:`mla_backward` (unless ``gather_bwd_recompute_p``). Descales: fp8 inputs only, and
    FA4 routes them to the 1CTA MLA kernel with ``k_descale is v_descale`` (FA4 asserts).
    Calls ``interface._flash_attn_fwd`` (the public functions take no descales).
    """
    _require_cuda()
    if qv is None:
        raise AdapterRefusal("mla_forward needs qv (b, s, h, 512)")
    r, p, row_max, o_lo = _forward_private(
        q, k, v, qv, softmax_scale=softmax_scale, causal=causal, window_size=(None, None),
        softcap=0.0, learnable_sink=learnable_sink, pack_gqa=None, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        return_lse=return_lse, page_table=page_table, seqused_q=seqused_q, seqused_k=seqused_k,
        num_splits=num_splits, block_sparse_tensors=None, mask_mod=None,
        gather_kv_indices=gather_kv_indices, requires_grad=for_backward,
        gather_bwd_recompute_p=gather_bwd_recompute_p, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale)
    return MLAForwardResult(r.out, r.lse, p, row_max, o_lo, r.config)


def mla_backward(q, k, v, qv, out, dout, lse, gather_kv_indices, *, fwd: Optional[MLAForwardResult] = None,
                 p=None, row_max=None, o_lo=None, softmax_scale: Optional[float] = None,
                 causal: bool = False, recompute_p: bool = False, token_chunk: Optional[int] = None,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
                 max_seqlen_k: Optional[int] = None, learnable_sink=None) -> MLABackwardResult:
    """FA4's sparse MLA backward (``interface._flash_attn_bwd_sparse_mla``, what the autograd
    backward of ``flash_attn_func(..., qv=, gather_kv_indices=)`` calls; FA4 has no dense MLA
    backward). ``p``/``row_max``/``o_lo`` from :func:`mla_forward` ``(for_backward=True)`` (or
    ``fwd=`` that result), or ``recompute_p=True`` (FA4's ``gather_bwd_recompute_p``: P is rebuilt
    in-kernel; the forward must have run with it). ``token_chunk``: FA4's
    ``gather_bwd_token_chunk``. Returns dq, dk, dv (both uses of V summed), dqv, dsink."""
    _require_cuda()
    import torch
    if fwd is not None:
        p, row_max, o_lo = fwd.p, fwd.row_max, fwd.o_lo
    ref = q if q is not None else qv
    cfg = _base_config("backward", "_flash_attn_bwd_sparse_mla", ref, k if k is not None else v, v,
                       softmax_scale=softmax_scale, causal=causal, window_size=(None, None),
                       softcap=0.0, learnable_sink=learnable_sink, pack_gqa=None,
                       varlen=cu_seqlens_q is not None, deterministic=False, return_lse=False)
    cfg.softmax_scale = _mla_scale(q, qv, v, softmax_scale)
    cfg.extra = {"mla": True, "has_qk": q is not None and k is not None, "head_dim_v": int(v.shape[-1]),
                 "gather_kv_indices": list(gather_kv_indices.shape), "recompute_p": bool(recompute_p),
                 "token_chunk": token_chunk, "saved_p": p is not None}
    fn = _fa4_fn("_flash_attn_bwd_sparse_mla")
    with _record_keys(fn) as rec, torch.no_grad():
        dq, dk, dv, dqv, dsink = _call_fa4(
            fn, q, k, v, qv, out, dout, lse, p, row_max, gather_kv_indices, learnable_sink=learnable_sink,
            softmax_scale=softmax_scale, causal=causal, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            recompute_p=recompute_p, token_chunk=token_chunk, o_lo=o_lo)
    key = rec.keys[-1] if rec.keys else None
    cfg.compile_key = _named_key(fn, key)
    cfg.exp2_emulation = "none (backward recomputes P with hardware exp2 only)"
    return MLABackwardResult(dq, dk, dv, dqv, dsink, cfg)


def combine(out_partial, lse_partial, *, out_dtype=None, return_lse: bool = True, cu_seqlens=None, seqused=None,
            virtual_batch_idx=None, out=None):
    """FA4's public ``flash_attn_combine``: merge split partial outputs.

    ``out_partial`` (num_splits, batch, seqlen, nheads, d) (fp32/bf16/fp16) and ``lse_partial``
    (num_splits, batch, seqlen, nheads) fp32 natural-log LSE of each split (FA4's forward LSE
    (batch, nheads, seqlen) transposed); with ``cu_seqlens`` (int32, batch + 1) the packed
    varlen form, (num_splits, total_q, nheads, d) and (num_splits, total_q, nheads). ``seqused``
    (int32, batch): merge only each sequence's first ``seqused[b]`` rows; ``virtual_batch_idx``
    (int32, batch): kernel slot i merges batch ``virtual_batch_idx[i]`` (the rows no slot or
    used length reaches are left unwritten); a release whose combine lacks one raises
    :class:`UnsupportedByRelease` when it is given (Note [One adapter for every release]). ``out``:
    the output buffer FA4 writes (a caller's, e.g. NaN-filled to see which rows it leaves). Returns
    ``(out, lse, config)``: ``out`` (batch, seqlen, nheads, d) or (total_q, nheads, d) in
    ``out_dtype`` (default: the partials' dtype), ``lse`` (batch, seqlen, nheads) or (total_q,
    nheads), or None. The arithmetic is modelled by ``fa4verify.kernels.twin_combine``.

    Raises :class:`NoCudaError` without a usable CUDA device (unless in FakeTensorMode).
    """
    _require_cuda()
    import torch
    from flash_attn.cute import interface
    from flash_attn.cute.interface import flash_attn_combine
    cfg = {"op": "combine", "entry": "flash_attn_combine", "versions": versions(),
           "arch": _device_arch(), "gpu_name": _gpu_name(),
           "partial_dtype": str(out_partial.dtype).replace("torch.", ""),
           "out_partial_shape": tuple(out_partial.shape), "num_splits": int(out_partial.shape[0]),
           "varlen": cu_seqlens is not None, "seqused": seqused is not None,
           "virtual_batch_idx": virtual_batch_idx is not None}
    fn = interface._flash_attn_fwd_combine
    with _record_keys(fn) as rec, torch.no_grad():
        out, lse = _call_fa4(flash_attn_combine, out_partial, lse_partial, out_dtype=out_dtype, return_lse=return_lse,
                             cu_seqlens=cu_seqlens, seqused=seqused, virtual_batch_idx=virtual_batch_idx, out=out)
    key = rec.keys[-1] if rec.keys else None
    cfg["compile_key"] = None if key is None else [_jsonable(x) for x in key]
    return out, lse, cfg


def sm90_bwd_sparse_block_size(head_dim: int, head_dim_v: Optional[int] = None, *, causal: bool = False,
                               local: bool = False) -> tuple[int, int]:
    """(q, kv) block size FA4's SM90 backward expects of ``block_sparse_tensors`` (128 Q rows, the
    KV tile ``_tile_size_bwd_sm90`` picks under sparsity) and, for the record, its
    ``dKV_swapAB`` (the flag the hd 200-240 prediction is about): ``(block_q, block_kv)``."""
    from flash_attn.cute import interface
    cfg = interface._tile_size_bwd_sm90(head_dim, head_dim_v or head_dim, causal, local,
                                        sparse_block_size_q=128)
    return 128, int(cfg.n_block_size)


def sm90_fwd_sparse_tile_n(head_dim: int, head_dim_v: Optional[int] = None, *, causal: bool = False,
                           local: bool = False, block_q: int = 128) -> int:
    """tile_n of FA4's SM90 forward under block sparsity with Q blocks of ``block_q`` rows
    (``_tile_size_fwd_sm90(..., sparse_block_size_q=block_q)``: at head dims <= 96 a Q block that
    192 does not divide takes the 128 x 128 tile)."""
    from flash_attn.cute import interface
    cfg = interface._tile_size_fwd_sm90(head_dim, head_dim_v or head_dim, causal, local,
                                        sparse_block_size_q=block_q)
    return int(cfg.n_block_size)


def sm90_bwd_config(head_dim: int, head_dim_v: Optional[int] = None, *, causal: bool = False,
                    local: bool = False, sparse: bool = False) -> dict[str, Any]:
    """FA4's SM90 ``BwdConfig`` for a head dim (as a dict), dense or under block sparsity."""
    from flash_attn.cute import interface
    cfg = interface._tile_size_bwd_sm90(head_dim, head_dim_v or head_dim, causal, local,
                                        sparse_block_size_q=128 if sparse else None)
    return {k: _jsonable(v) for k, v in asdict(cfg).items()}


def _block_lists(mask):
    """(count per row, index per row padded with 0 to the row length) of a boolean block mask
    ``(rows, cols)``, ascending block index: FA4's ``*_block_cnt`` / ``*_block_idx`` layout."""
    import numpy as np
    m = np.asarray(mask, bool)
    idx = np.zeros(m.shape, np.int32)
    for r in range(m.shape[0]):
        sel = np.flatnonzero(m[r])
        idx[r, : sel.size] = sel
    return m.sum(axis=1).astype(np.int32), idx


def block_sparse_tensors(block_mask, *, batch: int, nheads: int, block_size: tuple[int, int],
                         direction: str = "fwd", device: str = "cuda", deterministic: bool = False,
                         partial=None, pass_size: bool = True):
    """FA4's ``BlockSparseTensorsTorch`` for a dense boolean block mask ``(n_q_blocks,
    n_kv_blocks)`` (the same for every batch entry), or ``(batch, n_q_blocks, n_kv_blocks)`` (one
    per batch entry), the same for every head; or ``(batch, nheads, n_q_blocks, n_kv_blocks)``
    (one per batch entry and head: FA4 then keeps its GQA unpacked). ``partial`` (a boolean mask of the
    same shape inside ``block_mask``, or None): the blocks listed as *mask* blocks
    (``mask_block_cnt`` / ``mask_block_idx``: FA4 applies the call's ``mask_mod`` inside them); the
    other selected blocks are *full* blocks (no ``mask_mod``). ``direction="fwd"`` lists per Q
    block its KV blocks; ``"bwd"`` per KV block its Q blocks (the backward's Q-direction form).
    The dense semantics: key j is visible to query i iff the block ``(i // bq, j // bk)`` is full,
    or is a mask block and the mask_mod keeps (i, j).

    ``pass_size=False``: the lists go to FA4 with ``block_size=None`` (FA4 then takes its own
    tiles' sizes; the caller must have built the lists for them).

    ``deterministic`` (``"bwd"`` only): FA4's deterministic block-sparse backward serialises the dQ
    writes by an order it does not derive itself (``interface.py``: "deterministic block-sparse
    backward requires dq_write_order in block_sparse_tensors", and ``spt``); the order comes from
    FA4's own ``block_sparsity.compute_dq_write_order`` over both directions' lists, ascending KV
    blocks (``spt=False``, passed with the lists: FA4's backward takes the tensors' ``spt`` where they
    carry one, its own ``(causal or local) and deterministic`` only where they do not)."""
    import numpy as np
    import torch
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    m = np.asarray(block_mask, bool)
    part = np.zeros_like(m) if partial is None else np.asarray(partial, bool)
    if part.shape != m.shape or (part & ~m).any():
        raise ValueError(f"partial blocks {part.shape} must lie inside the block mask {m.shape}")
    if m.ndim == 2:
        m, part = (np.broadcast_to(x, (batch,) + x.shape) for x in (m, part))
    per_head = m.ndim == 4
    if per_head and m.shape[:2] != (batch, nheads):
        raise ValueError(f"block mask {m.shape}: a mask per head is ({batch}, {nheads}, n_q_blocks, n_kv_blocks)")
    if per_head:        # (batch, nheads, ...) -> (batch * nheads, ...): one list set per (batch, head)
        m, part = (x.reshape((-1,) + x.shape[2:]) for x in (m, part))
    elif m.ndim != 3 or m.shape[0] != batch:
        raise ValueError(f"block mask {m.shape}: expected (n_q_blocks, n_kv_blocks) or ({batch}, ...)")
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction={direction!r}: expected 'fwd' or 'bwd'")
    if deterministic and direction != "bwd":
        raise ValueError("deterministic=True is a backward (direction='bwd') setting")

    def full(x, dev):
        # (batch, ...) -> (batch, nheads, ...) (per head: (batch * nheads, ...) reshaped), built on
        # the device from a list (also under FakeTensorMode, where a CPU->CUDA copy fails)
        x = np.asarray(x, np.int32)
        if per_head:
            x = x.reshape((batch, nheads) + x.shape[1:])
        else:
            x = np.broadcast_to(x[:, None], (batch, nheads) + x.shape[1:])
        return torch.tensor(x.tolist(), dtype=torch.int32, device=dev)

    def lists(mm, pp, dev=device):
        """(mask_cnt, mask_idx, full_cnt, full_idx) of one direction, per batch entry."""
        per = [_block_lists(p_) + _block_lists(m_ & ~p_) for m_, p_ in zip(mm, pp)]
        return tuple(full(np.stack([e[i] for e in per]), dev) for i in range(4))
    tr = (0, 2, 1)
    mine_args = (m.transpose(tr), part.transpose(tr)) if direction == "bwd" else (m, part)
    mine = lists(*mine_args)
    order: dict[str, Any] = {}
    if deterministic:
        from flash_attn.cute.block_sparsity import compute_dq_write_order
        from torch._guards import active_fake_mode
        if active_fake_mode() is None:
            fwd = lists(m, part)
            partial, full_order = compute_dq_write_order(*fwd, *mine, spt=False)
        else:
            # compile-only (FakeTensorMode): FA4's order from real CPU lists (a CPU torch refuses
            # the scatter into a fake CUDA tensor), then the same values as device tensors
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            with unset_fake_temporarily():
                got = compute_dq_write_order(*lists(m, part, "cpu"), *lists(*mine_args, "cpu"), spt=False)
                got = [(t.tolist(), t.dtype) for t in got]
            partial, full_order = (torch.tensor(v, dtype=dt, device=device) for v, dt in got)
        order = dict(dq_write_order=partial, dq_write_order_full=full_order, spt=False)
    return BlockSparseTensorsTorch(
        mask_block_cnt=mine[0], mask_block_idx=mine[1], full_block_cnt=mine[2], full_block_idx=mine[3],
        block_size=tuple(int(b) for b in block_size) if pass_size else None, **order)


def block_sparse_tensors_varlen(block_masks, *, nheads: int, block_size: tuple[int, int], device: str = "cuda",
                                partial=None):
    """FA4's varlen ``BlockSparseTensorsTorch`` (forward only) for one boolean block mask
    ``(n_q_blocks_b, n_kv_blocks_b)`` per sequence ``b`` of a packed (``cu_seqlens``) call: counts
    ``[nheads, total_m_blocks]``, indices ``[nheads, total_n_blocks]`` where sequence ``b``'s Q block
    ``m`` lists its KV blocks (ascending, from 0 in the sequence) from ``cu_block_idx_offsets[b] + m
    * n_kv_blocks_b``; ``cu_total_m_blocks[b]`` = the Q blocks before sequence ``b``
    (``block_sparsity.py`` / ``seqlen_info.py``). ``partial`` (one boolean mask per sequence inside
    its block mask, or None): the blocks listed as *mask* blocks (the call's mask_mod decides
    inside them, Note [Partial blocks]); every other listed block is a *full* one. Key ``j`` of
    sequence ``b`` is visible to its query ``i`` iff ``block_masks[b][i // bq, j // bk]`` (and,
    in a mask block, the mask_mod keeps it)."""
    import numpy as np
    import torch
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    cnt, idx, mcnt, midx, cu_m, cu_i = [], [], [], [], [0], [0]
    for b, m in enumerate(np.asarray(m, bool) for m in block_masks):
        part = np.zeros_like(m) if partial is None else np.asarray(partial[b], bool) & m
        c, i = _block_lists(m & ~part)          # a sequence's rows, flattened row by row
        cnt.extend(c.tolist())
        idx.extend(i.reshape(-1).tolist())
        c, i = _block_lists(part)
        mcnt.extend(c.tolist())
        midx.extend(i.reshape(-1).tolist())
        cu_m.append(cu_m[-1] + m.shape[0])
        cu_i.append(cu_i[-1] + m.size)

    def dev(x, per_head=True):
        # built on the device from a list (also under FakeTensorMode, where a CPU->CUDA copy fails)
        x = np.asarray(x, np.int32)
        if per_head:
            x = np.broadcast_to(x, (nheads, x.size))
        return torch.tensor(x.tolist(), dtype=torch.int32, device=device)
    return BlockSparseTensorsTorch(
        mask_block_cnt=dev(mcnt), mask_block_idx=dev(midx),
        full_block_cnt=dev(cnt), full_block_idx=dev(idx),
        cu_total_m_blocks=dev(cu_m, False), cu_block_idx_offsets=dev(cu_i, False),
        block_size=tuple(int(b) for b in block_size))


def timing_callable(q, k, v, **kw):
    """A zero-argument callable running FA4's public forward exactly as :func:`forward` does but
    without the configuration record (for throughput timing only). ``kw`` as ``flash_attn_func``."""
    _require_cuda()
    import torch
    from flash_attn.cute import flash_attn_func

    def run():
        with torch.no_grad():
            return flash_attn_func(q, k, v, **kw)
    return run


def forward_backward_autograd(q, k, v, dout, *, dlse=None, learnable_sink=None, cu_seqlens_q=None,
                              cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
                              max_seqlen_k: Optional[int] = None, **kw):
    """Forward and backward through FA4's public autograd path, what training code runs:
    ``flash_attn_func`` (``flash_attn_varlen_func`` with ``cu_seqlens_q`` / ``cu_seqlens_k``), then
    ``torch.autograd.backward`` of ``(out, lse)`` with ``(dout, dlse)`` (``dlse`` None: the loss
    reads O only, and the call leaves ``return_lse`` at FA4's default, False, as a training step
    does: FA4 must still keep the LSE its backward needs; ``dout`` None: the LSE only; with a
    ``dlse`` the call asks ``return_lse=True``). ``kw``: the public functions' keywords (softmax_scale,
    causal, window_size, softcap, deterministic, pack_gqa, score_mod, score_mod_bwd, mask_mod,
    aux_tensors, aux_scalars, seqused_q, seqused_k (the varlen entry), block_sparse_tensors,
    block_sparse_tensors_bwd). The inputs are detached copies; a ``learnable_sink`` gets a gradient.

    Returns ``(out, lse, dq, dk, dv, dsink)`` (dsink None without a sink; lse as FA4 returns it).
    """
    _require_cuda()
    import torch
    kw.pop("return_lse", None)
    if dlse is not None:                  # a loss that reads the LSE asks for it
        kw["return_lse"] = True
    if kw.get("aux_scalars"):
        kw["aux_scalars"] = _fa4_scalars(kw["aux_scalars"])
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    sink = _release_sink(learnable_sink)
    sink = None if sink is None else sink.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        # seqused_q / seqused_k: only the varlen entry takes them (with batched q / k as well)
        if cu_seqlens_q is not None or cu_seqlens_k is not None or any(
                kw.get(n) is not None for n in ("seqused_q", "seqused_k", "page_table")):
            r = _call_fa4(_fa4_fn("flash_attn_varlen_func"), qq, kk, vv, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                          learnable_sink=sink, **kw)
        else:
            r = _call_fa4(_fa4_fn("flash_attn_func"), qq, kk, vv, learnable_sink=sink, **kw)
        out, lse = r if isinstance(r, tuple) else (r, None)     # a release may return O alone without return_lse
        if dlse is None:
            out.backward(dout)
        elif dout is None:          # a loss through the LSE alone (FA4's backward gets no dO)
            lse.backward(dlse)
        else:
            torch.autograd.backward([out, lse], [dout, dlse])
    return (out.detach(), None if lse is None else lse.detach(), qq.grad, kk.grad, vv.grad,
            None if sink is None else sink.grad)


def mla_forward_backward_autograd(q, k, v, qv, dout, *, gather_kv_indices, dlse=None,
                                  softmax_scale: Optional[float] = None, causal: bool = False,
                                  gather_bwd_recompute_p: bool = False):
    """Forward and backward of a sparse MLA call through FA4's public autograd path, what training
    code runs: ``flash_attn_func(q, k, v, qv=, gather_kv_indices=, return_lse=True)``, then
    ``torch.autograd.backward`` of ``(out, lse)`` with ``(dout, dlse)`` (``dlse`` None: the loss
    reads O only). The inputs are detached copies. Returns ``(out, lse, dq, dk, dv, dqv)`` (dv: both
    uses of the latent v)."""
    _require_cuda()
    import torch
    qq, kk, vv, qvv = (t.detach().clone().requires_grad_(True) for t in (q, k, v, qv))
    with torch.enable_grad():
        out, lse = _call_fa4(_fa4_fn("flash_attn_func"), qq, kk, vv, qv=qvv, gather_kv_indices=gather_kv_indices,
                             softmax_scale=softmax_scale, causal=causal, return_lse=True,
                             gather_bwd_recompute_p=gather_bwd_recompute_p)
        if dlse is None:
            out.backward(dout)
        elif dout is None:          # a loss through the LSE alone (FA4's backward gets no dO)
            lse.backward(dlse)
        else:
            torch.autograd.backward([out, lse], [dout, dlse])
    return out.detach(), lse.detach(), qq.grad, kk.grad, vv.grad, qvv.grad


def upstream_reference(q, k, v, *, causal: bool = False, window_size: tuple = (None, None),
                       softcap: float = 0.0, learnable_sink=None, upcast: bool = True,
                       reorder_ops: bool = False):
    """FA4's own test reference ``flash_attn.cute.testing.attention_ref`` (output only).

    ``upcast=False, reorder_ops=True`` is the "PyTorch low-precision reference" FA4's tests use
    to set their tolerance (everything in the input dtype: k*scale rounded, bf16 softmax output,
    bf16 GEMMs); ``upcast=True`` computes in fp32 and rounds the output to the input dtype.
    Runs on whatever device the tensors are on (no FA4 kernel involved).
    """
    from flash_attn.cute.testing import attention_ref
    out, _ = attention_ref(q, k, v, causal=causal, window_size=window_size, softcap=softcap,
                           learnable_sink=learnable_sink, upcast=upcast, reorder_ops=reorder_ops)
    return out


# ----------------------------------------------------------------------------------------------
# exp2 emulation switch (SM100 family; a no-op for the SM90 kernels)
# ----------------------------------------------------------------------------------------------

def clear_compile_caches() -> None:
    """Drop FA4's in-memory compiled forward/backward kernels (the tuning table is not part of
    FA4's compile key). Only the memory: FA4's own ``clear()`` of a persistent cache would also
    delete every object on disk, and its disk entries are kept apart by arch and tuning variant
    instead (Note [Kernel cache integrity])."""
    from flash_attn.cute import cache_utils
    interface = fa4_interface()
    for name in ("_flash_attn_fwd", "_flash_attn_bwd"):
        fn = getattr(interface, name, None)
        cache = getattr(fn, "compile_cache", None)
        if cache is not None:
            cache_utils.JITCache.clear(cache)


def _all_tuning_keys() -> list[tuple]:
    return [(two, causal, hd, sm103) for two in (True, False) for causal in (True, False)
            for hd in range(16, 513, 16) for sm103 in (True, False)]


@contextlib.contextmanager
def exp2_emulation_disabled() -> Iterator[None]:
    """Within the block FA4's SM100 forward uses hardware exp2 on every column.

    Recipe (flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq, not an upstream API): set ``ex2_emu_freq = 0`` for every key of
    ``flash_fwd_sm100._TUNING_CONFIG`` (absent keys are added with only that field, so the
    register split stays FA4's default) and of ``_FP8_TUNING_CONFIG``'s present keys; the table is
    in no FA4 compile key, so the block compiles into caches of its own, in memory and on disk
    (``kernel_cache.tuning_variant``; works with FA4's persistent cache on). SM90 kernels never
    emulate; there it changes nothing.
    """
    global _EMULATION_DISABLED
    import flash_attn.cute.flash_fwd_sm100 as fwd100
    tables = [fwd100._TUNING_CONFIG]
    try:
        from flash_attn.cute import config as fa_config
        if hasattr(fa_config, "SM100_TUNING"):
            tables.append(fa_config.SM100_TUNING)
    except Exception:
        fa_config = None
    saved = [copy.deepcopy(t) for t in tables]
    saved_fp8 = copy.deepcopy(getattr(fwd100, "_FP8_TUNING_CONFIG", {}))
    from fa4verify.kernels.kernel_cache import tuning_variant
    with tuning_variant("ex2emu-off"):     # the block's compiles kept apart, in memory and on disk
        try:
            for t in tables:
                for key in _all_tuning_keys():
                    t.setdefault(key, {})["ex2_emu_freq"] = 0
            for entry in getattr(fwd100, "_FP8_TUNING_CONFIG", {}).values():
                entry["ex2_emu_freq"] = 0
            _EMULATION_DISABLED = True
            yield
        finally:
            for t, s in zip(tables, saved):
                t.clear()
                t.update(s)
            if hasattr(fwd100, "_FP8_TUNING_CONFIG"):
                fwd100._FP8_TUNING_CONFIG.clear()
                fwd100._FP8_TUNING_CONFIG.update(saved_fp8)
            _EMULATION_DISABLED = False


def exp2_emulation_enabled() -> bool:
    """False inside :func:`exp2_emulation_disabled`."""
    return not _EMULATION_DISABLED


def fa4_compile_cache_class() -> Any:
    """FA4's in-process compile cache class (``flash_attn.cute.cache_utils.JITCache``; its
    persistent subclass calls it for compiles and disk loads alike): compile-only readers hook it
    (Note [Launch limits, compile-only] in fa4verify/compile/launch_limits.py)."""
    from flash_attn.cute import cache_utils
    return cache_utils.JITCache


def install_compile_only_shims(num_sms: int) -> None:
    """Make FA4 compile on a machine without a GPU (compile-only use; not numerics).

    FA4's SM100 static-persistent scheduler asks ``cutlass.utils.HardwareInfo`` for the SM count
    at trace time (it sizes the grid, not the per-element math), so it is answered with
    ``num_sms`` -- in ``cutlass.utils`` and in ``flash_attn.cute.tile_scheduler``, which imported
    the name; torch's ``__dlpack__`` of a fake CUDA tensor asks ``torch.cuda.current_device()``,
    answered with 0; basic indexing of a fake CUDA tensor (:func:`_install_fake_cuda_indexing`). Only ever called inside a compile subprocess (``fa4verify.compile.census``,
    ``fa4verify.compile.production``): it patches process-wide state.
    """
    import torch
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    import cutlass.utils as cu

    class _HardwareInfo:
        def __init__(self, device_id: int = 0):
            self.device_id = device_id

        def get_device_multiprocessor_count(self) -> int:
            return num_sms

        def get_max_active_clusters(self, cluster_size: int, stream=None) -> int:
            return num_sms // max(1, int(cluster_size))

    cu.HardwareInfo = _HardwareInfo  # type: ignore[assignment]
    try:
        import flash_attn.cute.tile_scheduler as ts
        if hasattr(ts, "HardwareInfo"):
            ts.HardwareInfo = _HardwareInfo
    except Exception:
        pass
    _install_fake_cuda_indexing()


def _install_fake_cuda_indexing() -> None:
    """Compile-only shim (this subprocess only): basic indexing (ints, slices, ``...``, None) of a
    fake CUDA tensor through ``aten.select`` / ``aten.slice``. A CPU-only torch refuses
    ``fake_cuda[..., :n]`` ("PyTorch is not linked with support for cuda devices": Python
    indexing takes a CUDA device guard before dispatch), which FA4's sparse MLA backward does
    (``dpsum[..., :nheads]``); the result is the same view the CUDA build would make. Likewise
    ``copy_`` into a fake CUDA tensor, through ``aten.copy_``."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    orig = torch.Tensor.__getitem__
    if getattr(orig, "_fa4verify_shim", False):
        return

    def getitem(self, idx):
        if not (isinstance(self, FakeTensor) and self.device.type == "cuda"):
            return orig(self, idx)
        items = idx if isinstance(idx, tuple) else (idx,)
        if not all(i is Ellipsis or i is None or isinstance(i, (int, slice)) for i in items) \
                or any(isinstance(i, bool) for i in items):
            return orig(self, idx)
        n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
        if sum(1 for i in items if i is Ellipsis) > 1 or n_real > self.dim():
            return orig(self, idx)
        if Ellipsis in items:
            e = items.index(Ellipsis)
            items = items[:e] + (slice(None),) * (self.dim() - n_real) + items[e + 1:]
        out, dim = self, 0
        for i in items:
            if i is None:
                out = out.unsqueeze(dim)
                dim += 1
            elif isinstance(i, int):
                out = torch.ops.aten.select.int(out, dim, i)
            else:
                st, sp, step = i.start, i.stop, i.step if i.step is not None else 1
                if step < 1:
                    return orig(self, idx)
                out = torch.ops.aten.slice.Tensor(out, dim, st, sp, step)
                dim += 1
        return out
    getitem._fa4verify_shim = True
    torch.Tensor.__getitem__ = getitem
    orig_copy = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        # the same device guard refuses ``fake_cuda.copy_(x)`` (FA4's empty-key sink fill: lse.copy_)
        if isinstance(self, FakeTensor) and self.device.type == "cuda":
            return torch.ops.aten.copy_.default(self, src, non_blocking)
        return orig_copy(self, src, non_blocking)
    torch.Tensor.copy_ = copy_
