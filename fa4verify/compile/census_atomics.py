"""Static evidence for FA4's deterministic backward: the floating-point atomics on the dQ path
and the semaphore that orders them, counted and located in the compiled PTX and SASS
(compile-only, no GPU; :func:`fa4verify.compile.census.compile_case` with ``backward=True``).

What FA4 4.0.0b36 does (source: ``flash_attn/cute/flash_bwd_sm100.py`` ``dQacc_reduce``,
``flash_bwd_sm90.py`` ``dQaccum_store``, ``barrier.py``, ``copy_utils.py``):

* dQ partial tiles of every KV block are added into the fp32 ``dq_accum`` in global memory with
  the TMA bulk reduction ``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32``
  (``copy_utils.cpasync_reduce_bulk_add_f32``; SASS ``UBLKRED.G.S.ADD.F32.RN``). These are
  floating-point atomics: different CTAs (KV blocks) add into the same dQ rows, and fp32 addition
  is not associative, so the order decides the bits.
* ``deterministic=False``: nothing orders them (no semaphore; the CTAs' reductions land in L2 in
  whatever order the schedule gives).
* ``deterministic=True``: the same bulk reductions, ordered by an int32 semaphore per
  (batch, head, m_block): before its reduce-add the CTA of KV block ``n`` spins with
  ``ld.global.acquire.gpu.b32`` (``barrier.wait_eq``; SASS ``LDG.E.STRONG.GPU``) until the
  semaphore equals its lock value (``n``; reversed with SPT), waits for its own bulk reductions to
  complete (``cp.async.bulk.wait_group`` without ``.read``), then releases with
  ``red.release.gpu.global.add.s32`` (``barrier.arrive_inc``; SASS ``MEMBAR.ALL.GPU`` +
  ``REDG.E.ADD.S32.STRONG.GPU``). The fp32 atomics stay; their order is fixed.

:func:`atomics_census` returns the counts per kernel (static instruction sites, not executions),
with the PTX line and SASS offset of each site; :func:`dq_verdict` turns a deterministic and a
default compile of the same configuration into the claim that ``census.bwd_atomics`` checks.
Every figure here is **compile-only**.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "PTX_KEYS",
    "SASS_KEYS",
    "atomics_census",
    "atomics_ptx",
    "atomics_sass",
    "dq_verdict",
    "kernel_role",
]

_FLOAT_TYPES = {"f32", "f64", "f16", "bf16", "f16x2", "bf16x2"}
_INT_TYPES = {"s32", "u32", "b32", "s64", "u64", "b64"}

#: PTX categories (each instruction lands in at most one)
PTX_KEYS = (
    "fp bulk reduce-add (cp.reduce.async.bulk .add.f32)",
    "tensor bulk reduce (cp.reduce.async.bulk.tensor .add)",
    "fp red/atom add (red/atom .add.f32/f16/bf16, any width)",
    "int red/atom (semaphore ops)",
    "  of which .release",
    "atom .cas",
    "acquire load (ld .acquire)",
    "membar / fence.sc / fence.acq_rel",
    "bulk wait_group (waits for writes)",
    "bulk wait_group.read (reads only)",
)
SASS_KEYS = (
    "UBLKRED .ADD.F32 (bulk fp32 reduce)",
    "UTMAREDG (tensor reduce)",
    "RED/ATOM fp ADD (F32/F16/BF16/F64)",
    "RED/ATOM int (semaphore)",
    "ATOM CAS",
    "LDG .STRONG.GPU (acquire load)",
    "MEMBAR .GPU/.SYS",
)


def _ptx_instructions(ptx: str):
    """(line number, opcode, operands) per PTX instruction, comments stripped."""
    for i, line in enumerate(ptx.splitlines(), 1):
        body = line.split("//")[0].strip()
        if not body or body.startswith((".", "$", "{", "}")):
            continue
        if body.startswith("@"):
            parts = body.split(None, 1)
            body = parts[1] if len(parts) > 1 else ""
        op, _, rest = body.partition(" ")
        yield i, op.strip().rstrip(";"), rest


def _ptx_category(op: str) -> Optional[str]:
    parts = op.split(".")
    head, mods = parts[0], set(parts[1:])
    if op.startswith("cp.reduce.async.bulk.tensor"):
        return PTX_KEYS[1] if "add" in mods else None
    if op.startswith("cp.reduce.async.bulk"):
        if "add" in mods and mods & _FLOAT_TYPES:
            return PTX_KEYS[0]
        return None
    if head in ("red", "atom"):
        if "cas" in mods:
            return PTX_KEYS[5]
        if "add" in mods and mods & _FLOAT_TYPES:
            return PTX_KEYS[2]
        if mods & _INT_TYPES:
            return PTX_KEYS[3]
        return None
    if head == "ld" and "acquire" in mods:
        return PTX_KEYS[6]
    if head == "membar" or (head == "fence" and (mods & {"sc", "acq_rel"})):
        return PTX_KEYS[7]
    if op.startswith("cp.async.bulk.wait_group"):
        return PTX_KEYS[9] if "read" in mods else PTX_KEYS[8]
    return None


def atomics_ptx(ptx: str) -> dict[str, Any]:
    """Counts per :data:`PTX_KEYS` and ``sites``: ``[line, category, instruction]`` for every
    floating-point atomic and every semaphore operation (in program order)."""
    counts = {k: 0 for k in PTX_KEYS}
    sites = []
    for ln, op, rest in _ptx_instructions(ptx):
        cat = _ptx_category(op)
        if cat is None:
            continue
        counts[cat] += 1
        if cat == PTX_KEYS[3] and ".release" in op:
            counts[PTX_KEYS[4]] += 1
        if cat not in (PTX_KEYS[8], PTX_KEYS[9]):
            sites.append([ln, cat.strip(), f"{op} {rest}".strip().rstrip(";")[:100]])
    return {"counts": counts, "sites": sites}


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _sass_category(op: str) -> Optional[str]:
    if op.startswith("UBLKRED") and ".ADD" in op and ".F32" in op:
        return SASS_KEYS[0]
    if op.startswith("UTMAREDG"):
        return SASS_KEYS[1]
    head = op.split(".")[0]
    if head in ("RED", "REDG", "ATOM", "ATOMG"):
        if ".CAS" in op:
            return SASS_KEYS[4]
        if re.search(r"\.(F32|F16|BF16|F64)(X\d+)?(?=\.|$)", op, re.I) and ".ADD" in op:
            return SASS_KEYS[2]
        return SASS_KEYS[3]
    if head == "LDG" and ".STRONG.GPU" in op or head == "LDG" and ".STRONG.SYS" in op:
        return SASS_KEYS[5]
    if head == "MEMBAR" and (".GPU" in op or ".SYS" in op):
        return SASS_KEYS[6]
    return None


def atomics_sass(sass: str) -> dict[str, Any]:
    """Counts per :data:`SASS_KEYS` and ``sites``: ``[offset (hex), category, opcode]``."""
    counts = {k: 0 for k in SASS_KEYS}
    sites = []
    for m in _SASS_LINE.finditer(sass):
        cat = _sass_category(m.group(2))
        if cat is None:
            continue
        counts[cat] += 1
        sites.append([m.group(1).lstrip("0") or "0", cat, m.group(2)])
    return {"counts": counts, "sites": sites}


def kernel_role(name: str) -> str:
    """"bwd main" / "bwd preprocess" / "bwd postprocess" / "fwd" / "other" from a dump name."""
    n = name.lower()
    if "preprocess" in n:
        return "bwd preprocess"
    if "postprocess" in n:
        return "bwd postprocess"
    if "backward" in n or "bwd" in n:
        return "bwd main"
    if "forward" in n or "fwd" in n:
        return "fwd"
    return "other"


def _short(name: str) -> str:
    m = re.search(r"(FlashAttention[A-Za-z0-9]+?)_object", name)
    return m.group(1) if m else name[:60]


def atomics_census(res) -> dict[str, Any]:
    """Per kernel of a compiled case (:class:`fa4verify.compile.census.CaseResult`): role, PTX and SASS
    atomics counts and sites. Keys are the FA4 kernel class names."""
    out: dict[str, Any] = {"label": res.case.label(), "arch": res.case.arch,
                           "deterministic": bool(res.case.deterministic),
                           "backward_config": {k: (res.backward_config or {}).get(k)
                                               for k in ("arch", "deterministic")},
                           "compile_key": {k: ((res.backward_config or {}).get("compile_key") or {}).get(k)
                                           for k in ("deterministic", "spt", "cluster_size", "use_2cta_instrs",
                                                     "m_block_size", "n_block_size")},
                           "where": "compile-only", "kernels": {}}
    for k in res.kernels:
        out["kernels"][_short(k.name)] = {"role": kernel_role(k.name), "ptx": atomics_ptx(k.ptx),
                                          "sass": atomics_sass(k.sass) if k.sass else None}
    return out


@dataclass
class DqVerdict:
    status: str            # "pass" | "fail"
    mode: str              # "no fp atomics" | "semaphore-ordered fp atomics" | ...
    summary: str
    rows: list


def _main(cen: dict) -> Optional[dict]:
    for v in cen["kernels"].values():
        if v["role"] == "bwd main":
            return v
    return None


def dq_verdict(det: dict, default: dict) -> DqVerdict:
    """The determinism claim from two :func:`atomics_census` results (same arch/config,
    ``deterministic=True`` and ``False``).

    Pass when the deterministic dQ path has no floating-point atomics, OR has them with the
    ordering mechanism present in the same kernel (acquire load + release reduction on an int
    semaphore, and bulk waits that wait for the writes); and the default mode's fp atomics are
    reported as unordered (no acquire/release semaphore ops in its main backward kernel).
    """
    rows = []
    for cen in (det, default):
        for name, v in cen["kernels"].items():
            p, s = v["ptx"]["counts"], (v["sass"] or {}).get("counts", {})
            rows.append([cen["arch"], "deterministic" if cen["deterministic"] else "default", name, v["role"],
                         p[PTX_KEYS[0]] + p[PTX_KEYS[1]] + p[PTX_KEYS[2]], p[PTX_KEYS[6]], p[PTX_KEYS[4]],
                         p[PTX_KEYS[5]], p[PTX_KEYS[8]], p[PTX_KEYS[9]],
                         s.get(SASS_KEYS[0], 0) + s.get(SASS_KEYS[1], 0) + s.get(SASS_KEYS[2], 0),
                         s.get(SASS_KEYS[5], 0), s.get(SASS_KEYS[3], 0), s.get(SASS_KEYS[6], 0)])
    md, mf = _main(det), _main(default)
    if md is None or mf is None:
        return DqVerdict("fail", "no backward kernel", "no main backward kernel in the dump", rows)
    pd, pf = md["ptx"]["counts"], mf["ptx"]["counts"]
    fp_d = pd[PTX_KEYS[0]] + pd[PTX_KEYS[1]] + pd[PTX_KEYS[2]]
    fp_f = pf[PTX_KEYS[0]] + pf[PTX_KEYS[1]] + pf[PTX_KEYS[2]]
    sem_d = pd[PTX_KEYS[6]] > 0 and pd[PTX_KEYS[4]] > 0 and pd[PTX_KEYS[8]] > 0
    sem_f = pf[PTX_KEYS[6]] > 0 or pf[PTX_KEYS[4]] > 0
    arch = det["arch"]
    # the acquire must come before a reduce-add and a release after one, in program order
    ordered = False
    if sem_d and fp_d:
        sites = md["ptx"]["sites"]
        lines = {c: [ln for ln, cat, _ in sites if cat == c.strip()] for c in PTX_KEYS}
        fp_lines = lines[PTX_KEYS[0]] + lines[PTX_KEYS[1]] + lines[PTX_KEYS[2]]
        rel = [ln for ln, cat, ins in sites if cat == PTX_KEYS[3].strip() and ".release" in ins]
        ordered = (min(lines[PTX_KEYS[6]]) < max(fp_lines)) and bool(rel) and max(rel) > min(fp_lines)
    if fp_d == 0:
        mode, ok = "no fp atomics", True
    elif ordered:
        mode, ok = "semaphore-ordered fp atomics", True
    else:
        mode, ok = "unordered fp atomics", False
    default_unordered = fp_f > 0 and not sem_f
    summary = (f"{arch} deterministic: {fp_d} fp32 reduce-add site(s) on dQ, {mode} "
               f"({pd[PTX_KEYS[6]]} ld.acquire spin, {pd[PTX_KEYS[4]]} red.release, "
               f"{pd[PTX_KEYS[8]]} bulk waits for writes); default: {fp_f} fp32 reduce-add site(s), "
               + ("unordered (no semaphore ops)" if default_unordered else
                  f"acquire {pf[PTX_KEYS[6]]} / release {pf[PTX_KEYS[4]]}"))
    return DqVerdict("pass" if ok else "fail", mode, summary, rows)


ROW_COLUMNS = ["arch", "mode", "kernel", "role", "PTX fp reduce/atomic", "PTX ld.acquire", "PTX red.release",
               "PTX atom.cas", "PTX bulk wait (writes)", "PTX bulk wait.read", "SASS fp reduce/atomic",
               "SASS LDG.STRONG.GPU", "SASS int RED/ATOM", "SASS MEMBAR.GPU"]


def compile_bwd_pair(arch: str, head_dim: int = 128, causal: bool = False,
                     workdir=None, seqlen: int = 1024) -> tuple[dict, dict, dict]:
    """Compile FA4's backward for ``arch`` with ``deterministic=True`` and with the default
    (two census subprocesses) and return ``(det, default, seconds)``: two :func:`atomics_census`
    dicts and the compile wall time per mode."""
    from fa4verify.compile import census as C
    out, secs = [], {}
    for det in (True, False):
        case = C.CensusCase(arch, head_dim, causal=causal, backward=True, deterministic=det, seqlen=seqlen)
        res = C.compile_case(case, workdir)
        secs["deterministic" if det else "default"] = round(res.seconds, 1)
        out.append(atomics_census(res))
    return out[0], out[1], secs
