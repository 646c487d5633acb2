"""Compile-only instruction census of production FA4 (no GPU needed).

Each case compiles FA4's forward (and optionally backward) for ``sm_90a`` or ``sm_100a`` in a
fresh Python process (so ``CUTE_DSL_*`` / ``FLASH_ATTENTION_*`` env vars apply cleanly), through
the adapter (:mod:`fa4verify.kernels.adapter`) on tensors made under torch ``FakeTensorMode``,
with ``CUTE_DSL_KEEP=ptx,cubin,sass`` and an existing ``CUTE_DSL_DUMP_DIR``. The PTX and SASS of
every kernel compiled are kept and counted:

* exp2: MUFU ``ex2.approx.ftz.f32`` vs the emulated polynomial (PTX ``add.rm{.ftz}.f32{x2}`` =
  one floor per emulated element or pair; FFMA/FFMA2 Horner chains with the ``POLY_EX2``
  constants ``0x3D9DF09D 0x3E6906A4 0x3F31F519``);
* conversions and their rounding mode (``cvt.rn.bf16x2.f32`` ... / SASS ``F2FP``);
* ``.ftz`` modifiers, ``rcp.approx``, ``lg2.approx``, ``tanh.approx``;
* the SM90 exponent argument ``S*c - m*c``: PTX ``mul.f32`` + ``sub.f32`` vs SASS FFMA with a
  negated addend (ptxas contraction).

**Emulated share from the code.** In the SM100 forward kernel each softmax thread owns one row
of a 128-column S tile and evaluates 128 exp2 per tile, unrolled in register (= column) order.
Reading the PTX of the softmax kernel in program order gives one event per column: ``H`` for
``ex2.approx`` and ``E E`` for each emulated pair (``add.rm.f32x2``). Splitting the stream into
runs of ``n_block_size`` column events gives the emulated column set of each unrolled softmax
copy, which :func:`derive_emulated_columns` compares with the twin's
``emulated_columns`` rule. Extra hardware ex2 outside the tile loop (row-rescale factor, sink,
LSE paths) are reported separately.

Every figure here is **compile-only**.

Shims used only inside the compile subprocess (documented, not numerics; they live in the adapter,
:func:`fa4verify.kernels.adapter.install_compile_only_shims`, so this module imports no FA4): FA4's SM100
static-persistent scheduler asks ``cutlass.utils.HardwareInfo`` for the SM count at trace time
(it sizes the grid, not the per-element math), so it is answered from
``FLASH_ATTENTION_NUM_SMS``; and torch's ``__dlpack__`` of a fake CUDA tensor asks
``torch.cuda.current_device()``, answered with 0.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from fa4verify.kernels.facts import fa4_arch_env, ptx_target  # noqa: E402  (light: no numpy)

#: compile target -> (FLASH_ATTENTION_ARCH, SM count of the persistent grid)
ARCHS = {ptx_target(a): (fa4_arch_env(a), sms) for a, sms in (("sm90", "132"), ("sm100", "148"))}
#: Compile targets the compile-only production path (:mod:`fa4verify.compile.production`) also takes:
#: sm_103a (B300-class; FA4 4.0.0b36 compiles its SM100 kernels for it, ``is_sm103`` in the
#: tuning key). The SM count only sizes the persistent grid, not the per-element math.
COMPILE_ARCHS = dict(ARCHS, **{ptx_target("sm103"): (fa4_arch_env("sm103"), "148")})


def compile_env(arch: str, dump_dir: str | os.PathLike, cache_dir: str | os.PathLike,
                keep: str = "ptx,cubin,sass") -> dict[str, str]:
    """The environment of a compile-only subprocess for ``arch`` (a key of :data:`COMPILE_ARCHS`):
    ``CUTE_DSL_ARCH``, ``FLASH_ATTENTION_ARCH``, ``FLASH_ATTENTION_NUM_SMS``, ``CUTE_DSL_KEEP``,
    ``CUTE_DSL_DUMP_DIR`` (must exist: the DSL silently writes nothing otherwise) and a private
    ``CUTE_DSL_CACHE_DIR``; knobs that would change FA4's kernel choice are removed."""
    if arch not in COMPILE_ARCHS:
        raise ValueError(f"arch must be one of {sorted(COMPILE_ARCHS)}, got {arch!r}")
    fa_arch, sms = COMPILE_ARCHS[arch]
    env = dict(os.environ)
    for k in ("FA_DISABLE_2CTA", "FA_CLC", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"):
        env.pop(k, None)
    env.update({
        "CUTE_DSL_ARCH": arch, "FLASH_ATTENTION_ARCH": fa_arch,
        "FLASH_ATTENTION_NUM_SMS": sms, "CUTE_DSL_KEEP": keep,
        "CUTE_DSL_DUMP_DIR": str(dump_dir), "CUTE_DSL_CACHE_DIR": str(cache_dir),
        "PYTHONWARNINGS": "ignore",
    })
    return env

#: POLY_EX2[3] constants as PTX hex immediates (c3, c2, c1); c0 = 1.0 = 0f3F800000.
POLY3_PTX = ("0f3D9DF09D", "0f3E6906A4", "0f3F31F519")


@dataclass(frozen=True)
class CensusCase:
    """One compile: FA4 forward (and backward if ``backward``) for ``arch``.

    Shape (batch, seqlen, nheads, head_dim) defaults to (2, 1024, 8, hd): seqlen > 256 so that
    the SM100 2-CTA rule can apply (flash_attn/cute/interface.py).
    """
    arch: str = "sm_90a"
    head_dim: int = 128
    causal: bool = False
    backward: bool = False
    deterministic: bool = False
    head_dim_v: Optional[int] = None
    batch: int = 2
    seqlen: int = 1024
    nheads: int = 8
    nheads_kv: Optional[int] = None
    dtype: str = "bfloat16"
    exp2_emulation: bool = True      # False: adapter.exp2_emulation_disabled() (tuning-table recipe)

    def label(self) -> str:
        s = f"{self.arch}-hd{self.head_dim}" + (f"x{self.head_dim_v}" if self.head_dim_v else "")
        s += "-causal" if self.causal else "-noncausal"
        if self.backward:
            s += "-bwd" + ("-det" if self.deterministic else "")
        if not self.exp2_emulation:
            s += "-noemu"
        return s


@dataclass
class KernelArtifacts:
    name: str
    ptx: str = ""
    sass: str = ""


@dataclass
class CaseResult:
    case: CensusCase
    seconds: float
    forward_config: dict
    backward_config: Optional[dict]
    kernels: list = field(default_factory=list)      # list[KernelArtifacts]

    def kernel(self, pattern: str) -> Optional[KernelArtifacts]:
        for k in self.kernels:
            if re.search(pattern, k.name):
                return k
        return None


# ----------------------------------------------------------------------------------------------
# compile (subprocess)
# ----------------------------------------------------------------------------------------------

def _install_cpu_shims(num_sms: int) -> None:
    """The compile-only shims, which patch FA4: they live in the adapter (the one importer of
    ``flash_attn.cute`` for production kernels), :func:`fa4verify.kernels.adapter.install_compile_only_shims`."""
    from fa4verify.kernels import adapter
    adapter.install_compile_only_shims(num_sms)


def _worker(spec_json: str) -> None:
    """Runs inside the compile subprocess (env already set by the parent)."""
    spec = json.loads(spec_json)
    case = CensusCase(**spec["case"])
    _install_cpu_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from fa4verify.kernels import adapter
    dt = getattr(torch, case.dtype)
    hdv = case.head_dim_v or case.head_dim
    hkv = case.nheads_kv or case.nheads
    out: dict[str, Any] = {}
    import contextlib
    switch = contextlib.nullcontext() if case.exp2_emulation else adapter.exp2_emulation_disabled()
    with switch, FakeTensorMode():
        q = torch.empty(case.batch, case.seqlen, case.nheads, case.head_dim, dtype=dt, device="cuda")
        k = torch.empty(case.batch, case.seqlen, hkv, case.head_dim, dtype=dt, device="cuda")
        v = torch.empty(case.batch, case.seqlen, hkv, hdv, dtype=dt, device="cuda")
        f = adapter.forward(q, k, v, causal=case.causal, return_lse=True)
        out["forward_config"] = f.config.to_dict()
        if case.backward:
            b = adapter.backward(q, k, v, f.out, torch.empty_like(f.out), f.lse, causal=case.causal,
                                 deterministic=case.deterministic)
            out["backward_config"] = b.config.to_dict()
    Path(spec["result"]).write_text(json.dumps(out))


def compile_case(case: CensusCase, workdir: str | os.PathLike | None = None,
                 timeout: float = 600.0) -> CaseResult:
    """Compile ``case`` in a subprocess and return its PTX/SASS per kernel.

    Raises ``RuntimeError`` (with the child's stderr tail) when the compile fails, and
    ``FileNotFoundError`` if no PTX was dumped.
    """
    if case.arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {case.arch!r}")
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fa4census-"))
    dump = (base / case.label()).resolve()
    dump.mkdir(parents=True, exist_ok=True)
    for old in dump.iterdir():
        if old.is_file():
            old.unlink()
    env = compile_env(case.arch, dump, base / "dsl-cache")
    result_json = dump / "_config.json"
    spec = json.dumps({"case": asdict(case), "result": str(result_json)})
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c",
                        "import sys; from fa4verify.compile.census import _worker; _worker(sys.argv[1])", spec],
                       env=env, capture_output=True, text=True, timeout=timeout)
    dt = time.time() - t0
    if r.returncode != 0 or not result_json.exists():
        raise RuntimeError(f"FA4 compile for {case.label()} failed (rc={r.returncode}): "
                           f"{r.stderr[-3000:]}")
    cfg = json.loads(result_json.read_text())
    kernels: dict[str, KernelArtifacts] = {}
    for p in sorted(dump.iterdir()):
        if p.suffix == ".ptx":
            stem = p.name.split(f".{case.arch}")[0]
            kernels.setdefault(stem, KernelArtifacts(stem)).ptx = p.read_text(errors="replace")
        elif p.suffix == ".sass":
            kernels.setdefault(p.stem, KernelArtifacts(p.stem)).sass = p.read_text(errors="replace")
    if not any(k.ptx for k in kernels.values()):
        raise FileNotFoundError(f"no PTX dumped in {dump} (is CUTE_DSL_DUMP_DIR honoured?)")
    return CaseResult(case, dt, cfg.get("forward_config", {}), cfg.get("backward_config"),
                      list(kernels.values()))


# ----------------------------------------------------------------------------------------------
# counting
# ----------------------------------------------------------------------------------------------

_PTX_PATTERNS = {
    "ex2.approx.ftz.f32": r"\bex2\.approx\.ftz\.f32\b",
    "ex2.approx.f32 (no ftz)": r"\bex2\.approx\.f32\b",
    "lg2.approx.ftz.f32": r"\blg2\.approx\.ftz\.f32\b",
    "rcp.approx.ftz.f32": r"\brcp\.approx\.ftz\.f32\b",
    "rcp.rn.f32 (IEEE)": r"\brcp\.rn\.f32\b",
    "div.rn.f32": r"\bdiv\.rn\.f32\b",
    "tanh.approx.f32": r"\btanh\.approx\.f32\b",
    "add.rm.ftz.f32 (emulation floor)": r"\badd\.rm\.ftz\.f32\b",
    "add.rm.f32x2 (emulation floor, pair)": r"\badd\.rm(?:\.ftz)?\.f32x2\b",
    "fma.rn.f32": r"\bfma\.rn\.f32\b",
    "fma.rn.f32x2": r"\bfma\.rn(?:\.ftz)?\.f32x2\b",
    "mul.f32 (contractible)": r"\bmul\.f32\b",
    "sub.f32 (contractible)": r"\bsub\.f32\b",
    "add.f32 (contractible)": r"\badd\.f32\b",
    "mul.rn.f32x2": r"\bmul\.rn(?:\.ftz)?\.f32x2\b",
    "sub.rn.f32x2": r"\bsub\.rn(?:\.ftz)?\.f32x2\b",
    "add.rn.f32x2": r"\badd\.rn(?:\.ftz)?\.f32x2\b",
    "max.f32": r"\bmax(?:\.ftz)?(?:\.NaN)?\.f32\b",
    "cvt.rn.bf16x2.f32": r"\bcvt\.rn\.bf16x2\.f32\b",
    "cvt.rn.f16x2.f32": r"\bcvt\.rn\.f16x2\.f32\b",
    "cvt.rn.bf16.f32": r"\bcvt\.rn\.bf16\.f32\b",
    "cvt.rn.f16.f32": r"\bcvt\.rn\.f16\.f32\b",
    "cvt.rz/rm/rp to 16-bit": r"\bcvt\.r[zmp]\.(?:bf16|f16)(?:x2)?\.f32\b",
    ".ftz (any)": r"\.ftz\b",
    "poly3 c3 0f3D9DF09D": r"0f3D9DF09D",
    "poly3 c2 0f3E6906A4": r"0f3E6906A4",
    "poly3 c1 0f3F31F519": r"0f3F31F519",
}

_SASS_PATTERNS = {
    "MUFU.EX2": r"\bMUFU\.EX2\b",
    "MUFU.LG2": r"\bMUFU\.LG2\b",
    "MUFU.RCP": r"\bMUFU\.RCP\b",
    "MUFU.TANH": r"\bMUFU\.TANH\b",
    "FFMA": r"\bFFMA(?:\.\w+)*\s",
    "FFMA with negated addend": r"\bFFMA(?:\.\w+)*\s+R\w+,\s*-?R\w+,\s*-?U?R\w+(?:\.\w+)?,\s*-R",
    "FFMA2": r"\bFFMA2(?:\.\w+)*\s",
    "FADD": r"\bFADD(?:\.\w+)*\s",
    "FADD.FTZ.RM": r"\bFADD\.FTZ\.RM\b",
    "FADD2": r"\bFADD2(?:\.\w+)*\s",
    "FADD2.RM": r"\bFADD2\.RM\b",
    "FMUL": r"\bFMUL(?:\.\w+)*\s",
    "FMUL2": r"\bFMUL2(?:\.\w+)*\s",
    "FMNMX": r"\bFMNMX(?:\.\w+)*\s",
    "F2FP.BF16": r"\bF2FP\.BF16",
    "F2FP.F16": r"\bF2FP\.F16",
    "HGMMA": r"\bHGMMA\b",
    "UTC*MMA": r"\bUTC\w*MMA\w*\b",
}


def count_ptx(ptx: str) -> dict[str, int]:
    """Instruction/constant counts in PTX text (comments stripped)."""
    body = "\n".join(line.split("//")[0] for line in ptx.splitlines())
    return {k: len(re.findall(p, body)) for k, p in _PTX_PATTERNS.items()}


def count_sass(sass: str) -> dict[str, int]:
    """Instruction counts in nvdisasm SASS text."""
    return {k: len(re.findall(p, sass)) for k, p in _SASS_PATTERNS.items()}


_EVENT_RE = re.compile(r"\bex2\.approx(?:\.ftz)?\.f32\b|\badd\.rm(?:\.ftz)?\.f32x2\b|\badd\.rm\.ftz\.f32\b")


def exp2_event_stream(ptx: str) -> str:
    """One letter per exp2 evaluation in PTX program order: ``H`` = hardware ex2.approx,
    ``E`` = emulated (an ``add.rm.f32x2`` floor counts as two columns ``EE``, a scalar
    ``add.rm.ftz.f32`` as one ``E``)."""
    body = "\n".join(line.split("//")[0] for line in ptx.splitlines())
    out = []
    for m in _EVENT_RE.finditer(body):
        t = m.group(0)
        if t.startswith("ex2"):
            out.append("H")
        elif t.endswith("x2"):
            out.append("EE")
        else:
            out.append("E")
    return "".join(out)


@dataclass
class EmulationDerivation:
    """What the PTX says about the emulated exp2 columns of one SM100 forward kernel."""
    n_block: int
    tile_copies: int                  # unrolled softmax copies found (runs of n_block events)
    emulated_columns: list            # column set shared by all copies (None if they differ)
    copies_agree: bool
    emulated_per_copy: list
    extra_hardware_ex2: int           # ex2.approx outside the tile runs (rescale, sink, ...)
    share: float

    def to_dict(self) -> dict:
        return asdict(self)


def derive_emulated_columns(ptx: str, n_block: int = 128, max_lead: int = 8) -> EmulationDerivation:
    """Parse the exp2 event stream into unrolled softmax tile copies of ``n_block`` column events
    and read the emulated column indices (positions of ``E`` in each copy).

    The stream is copies separated by a few extra hardware ex2 (row-rescale factor, sink, ...).
    For each lead offset ``s < max_lead`` the first copy ``ev[s:s+n_block]`` is the reference;
    then greedily, a window with the reference's ``E`` set is taken as a copy, otherwise one
    ``H`` is skipped as extra (an ``E`` that fits no copy is a mismatch). The offset with the
    fewest mismatches, then fewest extras, wins. Independent of the twin: the twin's rule is
    compared afterwards (:func:`census_case`).
    """
    ev = exp2_event_stream(ptx)
    if "E" not in ev:   # no emulation anywhere (SM90, SM103, or disabled): nothing to align
        return EmulationDerivation(n_block, 0, [], True, [], len(ev), 0.0)
    best = None
    for s in range(0, min(max_lead, max(1, len(ev) - n_block + 1))):
        ref = [j for j, c in enumerate(ev[s:s + n_block]) if c == "E"]
        i, extras, mism, copies = s, s, 0, 0
        while i + n_block <= len(ev):
            w = ev[i:i + n_block]
            if [j for j, c in enumerate(w) if c == "E"] == ref:
                copies += 1
                i += n_block
            else:
                if ev[i] == "E":
                    mism += 1
                else:
                    extras += 1
                i += 1
        tail = ev[i:]
        extras += tail.count("H")
        mism += tail.count("E")          # emulated events that fit no copy
        score = (mism, extras)
        if best is None or score < best[0]:
            best = (score, ref, copies, extras, mism)
    if best is None:
        return EmulationDerivation(n_block, 0, [], True, [], len(ev), 0.0)
    (_, ref, copies, extras, mism) = best
    per = [len(ref)] * copies
    share = len(ref) / n_block if copies else 0.0
    return EmulationDerivation(n_block, copies, ref if mism == 0 else None, mism == 0, per,
                               extras, share)


def census_case(res: CaseResult) -> dict[str, Any]:
    """Flat census of a compiled case: per-kernel PTX/SASS counts, plus for forward kernels the
    derived emulated share and the twin's rule (SM100)."""
    out: dict[str, Any] = {"case": asdict(res.case), "label": res.case.label(),
                           "compile_seconds": round(res.seconds, 2),
                           "forward_config": {k: res.forward_config.get(k) for k in (
                               "arch", "tile_mn", "pack_gqa", "use_2cta", "tuning_key",
                               "exp2_emulation", "emulated_share", "emulated_columns",
                               "emulated_share_source")},
                           "kernels": {}}
    if res.backward_config:
        out["backward_config"] = {k: res.backward_config.get(k) for k in (
            "arch", "deterministic", "exp2_emulation", "emulated_share")}
    for k in res.kernels:
        entry = {"ptx": count_ptx(k.ptx), "sass": count_sass(k.sass) if k.sass else None,
                 "ptx_bytes": len(k.ptx), "sass_bytes": len(k.sass)}
        out["kernels"][k.name] = entry
    fwd = forward_kernel(res)
    if fwd is not None:
        n_block = int((res.forward_config.get("tile_mn") or [None, 128])[1] or 128)
        d = derive_emulated_columns(fwd.ptx, n_block)
        twin_cols = res.forward_config.get("emulated_columns")
        out["forward_kernel"] = fwd.name
        out["emulation_from_ptx"] = d.to_dict()
        out["twin_emulated_columns"] = twin_cols
        out["twin_share"] = res.forward_config.get("emulated_share")
        if twin_cols is not None and d.emulated_columns is not None:
            out["ptx_matches_twin"] = list(d.emulated_columns) == list(twin_cols)
        else:
            out["ptx_matches_twin"] = None
        # SM90 exponent-argument contraction: FFMA with negated addend in SASS vs PTX mul/sub
        if fwd.sass:
            s = count_sass(fwd.sass)
            out["ffma_negated_addend"] = s["FFMA with negated addend"]
    return out


def forward_kernel(res: CaseResult) -> Optional[KernelArtifacts]:
    """The main forward kernel of a case: the kernel with the most ex2.approx in its PTX among
    those whose name does not look like a backward/pre/post-process kernel."""
    best, best_n = None, -1
    for k in res.kernels:
        if re.search(r"(?i)bwd|backward|preprocess|postprocess|convert|dsink", k.name):
            continue
        n = len(re.findall(r"\bex2\.approx", k.ptx))
        if n > best_n:
            best, best_n = k, n
    return best


def default_matrix(slow: bool = False) -> list[CensusCase]:
    """The CI matrix (small) or the full matrix (``slow``)."""
    cases = [CensusCase("sm_100a", 128, causal=False), CensusCase("sm_100a", 128, causal=True),
             CensusCase("sm_90a", 128, causal=True)]
    if slow:
        for arch in ("sm_90a", "sm_100a"):
            for hd in (64, 128, 192, 256):
                for causal in (False, True):
                    c = CensusCase(arch, hd, causal=causal,
                                   head_dim_v=128 if (arch == "sm_100a" and hd == 192) else None)
                    if c not in cases:
                        cases.append(c)
        cases.append(CensusCase("sm_90a", 128, causal=True, backward=True, deterministic=True))
        cases.append(CensusCase("sm_100a", 128, causal=False, backward=True, deterministic=True))
    return cases


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
