"""Proposed SM100 kernel-variant key for fa4verify (red-team round 14), runnable on the CPU.

The SM100 (B200, sm_100a) configuration of an FA4 call is not the output of one host function,
as it is on SM90 (``_tile_size_fwd_sm90``): ``_flash_attn_fwd`` decides q_stage
(``_get_fwd_config``), PackGQA, 2-CTA, the persistent scheduler, S ping-pong and split-KV
inline, and ``FlashAttentionForwardSm100.__init__`` derives TMA-vs-cp.async Q/O, the
correction-warp epilogue, the exp2-emulation tuning row and the scheduler class from those.
So the key is read from **the kernel object FA4's own host code builds**: the call goes through
fa4verify's ``ProductionTarget(fake=True)`` (FakeTensorMode, nothing launched) with
``cute.compile`` replaced by a recorder and FA4's JIT caches by always-miss dicts, exactly as
red-team rounds 13/14 census it. No FA4 table or rule is copied, except the five trace-time
lines of ``FlashAttentionForwardSm100.__call__`` (flash_fwd_sm100.py:549-557) that turn the
object's ``_tune`` row into ``ex2_emu_freq``: :func:`_ex2` mirrors them (they run inside the
traced ``__call__``, which the recorder does not run).

``sm100_fwd_variant(problem)`` / ``sm100_bwd_variant(problem, deterministic)`` need a fake SM100
device (``fa4verify.compile.production.enter_fake_device("b200")``) or a real one; ~30-60 ms
per call. ``python sm100_variants.py`` prints the keys of a few calls.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Optional

#: the forward / backward kernel classes whose configuration the key describes (the pre/post-
#: process, varlen block-count and combine kernels follow from them)
MAIN_FWD = ("FlashAttentionForwardSm100", "FlashAttentionMLAForwardSm100", "FlashAttentionMLAForward1CtaSm100",
            "FlashAttentionMLAForward1CtaKb64Sm100")
MAIN_BWD = ("FlashAttentionBackwardSm100", "BlackwellFusedMultiHeadAttentionBackward",
            "FlashAttentionSparseMLABackwardSm100")


def _mode(causal: bool, local: bool) -> str:
    return "local" if local else ("causal" if causal else "none")


def _ex2(a: dict) -> tuple[int, int]:
    """(ex2_emu_freq, ex2_emu_start_frg) as ``FlashAttentionForwardSm100.__call__`` sets them
    for a 16-bit dtype (flash_fwd_sm100.py:549-557, mirrored): 0 = every exp2 on MUFU."""
    tune = a.get("_tune") or {}
    start = tune.get("ex2_emu_start_frg", 1)
    if not a["enable_ex2_emu"]:
        return 0, start
    freq = tune.get("ex2_emu_freq", 16)
    if a["pack_gqa"] and a["head_dim_padded"] > 64 and not a["is_causal"] and not a["is_local"]:
        freq = 32 if a["is_varlen_q"] else tune.get("ex2_emu_freq", 10)
    return freq, start


def fwd_key(cls: str, a: dict) -> tuple:
    """The forward variant of a recorded kernel object (class name, attribute dict)."""
    if cls == "FlashAttentionForwardSm100":
        freq, start = _ex2(a)
        return ("fwd", "sm100",
                a["head_dim_padded"], a["head_dim_v_padded"],
                bool(a["check_hdim_oob"] or a["check_hdim_v_oob"]),      # predicated head-dim tail
                _mode(a["is_causal"], a["is_local"]),
                a["m_block_size"], a["n_block_size"], a["q_stage"],
                a["use_2cta_instrs"], a["use_s_ping_pong"],
                a["pack_gqa"], a["use_tma_Q"], a["use_tma_O"],         # cp.async Q / correction-warp epilogue
                a["is_split_kv"],
                freq, start,                                           # polynomial exp2 share
                a["TileScheduler"])
    # MLA / top-k gather forwards: their own host flags
    keep = ("is_causal", "pack_gqa", "is_topk_gather", "is_split_kv", "use_2cta_instrs", "use_cpasync_load_KV",
            "use_tma_KV", "rescale_threshold", "s_ahead", "pad_qheads", "use_clc_scheduler", "has_qk", "is_fp8")
    return ("fwd", cls) + tuple((k, a[k]) for k in keep if k in a)


def bwd_key(cls: str, a: dict, *, gqa: bool, deterministic: bool) -> tuple:
    """The backward variant of a recorded kernel object. ``gqa``/``deterministic``: the call's
    (the hd-256 kernel keeps neither as an attribute: GQA is in K's shape, determinism in the
    semaphores it is handed)."""
    if cls == "FlashAttentionBackwardSm100":
        return ("bwd", "sm100",
                a["tile_hdim"], a["tile_hdimv"], bool(a["check_hdim_oob"] or a["check_hdim_v_oob"]),
                _mode(a["is_causal"], a["is_local"]),
                a["tile_m"], a["tile_n"], a["cta_schedule"],               # 1CTA / 2CTA pipelined / 2CTA serial
                a["qhead_per_kvhead"] > 1, a["deterministic"], a["spt_override"],
                a["split_P_dS"], a["q_subtile_factor"], a["kv_subtile_factor"])
    if cls == "BlackwellFusedMultiHeadAttentionBackward":
        local = a.get("window_size_left") is not None or a.get("window_size_right") is not None
        return ("bwd", "sm100_hd256", 256, 256, False, _mode(a["is_causal"], local),
                a["tile_m_dkdv"], a["tile_n_dkdv"], "hd256_2cta", gqa, bool(deterministic), None, False, 1, 1)
    keep = ("is_causal", "pack_gqa", "is_topk_gather", "use_2cta_instrs", "rescale_threshold", "recompute_p")
    return ("bwd", cls, deterministic) + tuple((k, a[k]) for k in keep if k in a)


# ---------------------------------------------------------------------------------------------
# the recorder: FA4's host code runs, nothing is traced or compiled
# ---------------------------------------------------------------------------------------------

def _val(x: Any) -> Any:
    import enum
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {k: _val(v) for k, v in x.items()}
    if isinstance(x, enum.Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, type):
        return x.__name__
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in x):
        return tuple(x)
    return f"<{type(x).__name__}>"


@contextlib.contextmanager
def recording():
    """Within the block every ``cute.compile`` of FA4 is recorded (class, attribute dict, the
    None-ness of its arguments) and returns a no-op; FA4's JIT caches always miss. Yields the list."""
    import cutlass.cute as cute
    from flash_attn.cute import interface as I
    rec: list = []

    def fake_compile(obj, *a, **k):
        attrs = {}
        for name, v in vars(obj).items():
            try:
                attrs[name] = _val(v)
            except Exception:  # noqa: BLE001
                attrs[name] = "<?>"
        rec.append((type(obj).__name__, attrs, [None if v is None else _val(v) for v in a]))
        return lambda *a, **k: None

    class Miss(dict):
        def __contains__(self, k):
            return False

        def __setitem__(self, k, v):
            pass

    fns = [getattr(I, n) for n in dir(I) if hasattr(getattr(I, n), "compile_cache")]
    saved = [(f, f.compile_cache) for f in fns]
    old = cute.compile
    cute.compile = fake_compile
    for f in fns:
        f.compile_cache = Miss()
    try:
        yield rec
    finally:
        cute.compile = old
        for f, c in saved:
            f.compile_cache = c


def _ensure_device() -> None:
    if os.environ.get("FA4VERIFY_FAKE_DEVICE") is None and os.environ.get("FLASH_ATTENTION_ARCH") is None:
        from fa4verify.compile.production import enter_fake_device
        enter_fake_device("b200")
    from fa4verify.compile.production import _shims
    _shims()


def record_call(problem: Any, *, backward: bool, deterministic: bool = False,
                emulation: str = "default") -> dict[str, list]:
    """``{"fwd": [...], "bwd": [...]}``: the kernel objects FA4 builds for ``problem``'s forward
    and (where FA4 has one) backward, each ``(class, attrs, args)``."""
    _ensure_device()
    from fa4verify.targets import ProductionTarget
    tgt = ProductionTarget(fake=True, emulation=emulation)
    out: dict[str, list] = {"fwd": [], "bwd": []}
    a = problem.materialize()
    with recording() as rec:
        f = tgt.forward(problem, a)
        out["fwd"] = list(rec)
        rec.clear()
        if backward and tgt.backward_unsupported(problem) is None:
            tgt.backward(problem, a, f, deterministic=deterministic)
            out["bwd"] = list(rec)
    return out


def _fwd_of(recs: list) -> Optional[tuple]:
    for cls, a, _args in recs:
        if cls in MAIN_FWD:
            return fwd_key(cls, a)
    return None


def _bwd_of(recs: list, problem: Any, deterministic: bool) -> Optional[tuple]:
    for cls, a, _args in recs:
        if cls in MAIN_BWD:
            return bwd_key(cls, a, gqa=problem.nheads > problem.nheads_kv, deterministic=deterministic)
    return None


def sm100_fwd_variant(problem: Any) -> Optional[tuple]:
    """The SM100 forward kernel variant FA4 builds for ``problem`` (None if FA4 refuses it)."""
    from fa4verify.errors import Unsupported
    try:
        return _fwd_of(record_call(problem, backward=False)["fwd"])
    except (Unsupported, AssertionError, ValueError, NotImplementedError):
        return None


def sm100_bwd_variant(problem: Any, deterministic: bool) -> Optional[tuple]:
    """The SM100 backward kernel variant FA4 builds for ``problem`` with ``deterministic`` (None
    where FA4 has no backward for it or refuses it)."""
    from fa4verify.errors import Unsupported
    try:
        return _bwd_of(record_call(problem, backward=True, deterministic=deterministic)["bwd"], problem,
                       deterministic)
    except (Unsupported, AssertionError, ValueError, NotImplementedError):
        return None


def variants_of(problem: Any, *, backward: bool, deterministic: bool) -> tuple[Optional[tuple], Optional[tuple]]:
    """Both keys from one pass (the forward's objects, then the backward's)."""
    r = record_call(problem, backward=backward, deterministic=deterministic)
    return _fwd_of(r["fwd"]), (_bwd_of(r["bwd"], problem, deterministic) if backward else None)


def tag(v: tuple) -> str:
    """A short readable name of a variant key."""
    if v[0] == "fwd" and v[1] == "sm100":
        (_f, _a, hdp, hdvp, oob, mode, tm, tn, qs, cta2, pp, pack, tq, to, split, freq, start, sched) = v
        return (f"fwd_d{hdp}" + (f"x{hdvp}" if hdvp != hdp else "") + ("_oob" if oob else "")
                + f"_{mode}_{tm}x{tn}_q{qs}" + ("_2cta" if cta2 else "") + ("_pingpong" if pp else "")
                + (("_pack" + ("" if tq else "_cpQ")) if pack else "") + ("" if to else "_noTmaO")
                + ("_split" if split else "") + f"_ex2f{freq}s{start}_{sched.replace('TileScheduler', '').replace('Scheduler', '')}")
    if v[0] == "bwd" and v[1] in ("sm100", "sm100_hd256"):
        (_b, _a, th, thv, oob, mode, tm, tn, sched, gqa, det, spt, splitp, qsub, kvsub) = v
        return (f"bwd_d{th}" + (f"x{thv}" if thv != th else "") + ("_oob" if oob else "") + f"_{mode}_{tm}x{tn}_"
                + str(sched).replace("CtaSchedule.", "") + ("_gqa" if gqa else "_mha") + ("_det" if det else "_nondet")
                + ("_spt" if spt else "") + (f"_kvsub{kvsub}" if kvsub != 1 else "") + (f"_qsub{qsub}" if qsub != 2 else ""))
    return "_".join(str(x) for x in v[:3]) + "_" + "_".join(f"{k}={w}" for k, w in v[3:] if isinstance(k, str))


if __name__ == "__main__":
    _ensure_device()
    from fa4verify.problem import AttentionProblem
    for kw in (dict(seqlen_q=256, seqlen_k=256, nheads=2, nheads_kv=2, head_dim=64, head_dim_v=64, causal=True),
               dict(seqlen_q=64, seqlen_k=256, nheads=2, nheads_kv=2, head_dim=128, head_dim_v=128),
               dict(seqlen_q=256, seqlen_k=256, nheads=14, nheads_kv=2, head_dim=128, head_dim_v=128),
               dict(seqlen_q=256, seqlen_k=256, nheads=2, nheads_kv=2, head_dim=256, head_dim_v=256, causal=True)):
        p = AttentionProblem(arch="sm100", dtype="bf16", batch=1, **kw)
        for det in (False, True):
            f, b = variants_of(p, backward=True, deterministic=det)
            print(p.describe(), "det" if det else "nondet")
            print("   ", tag(f) if f else None)
            print("   ", tag(b) if b else None)
