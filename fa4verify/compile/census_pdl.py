"""Static evidence that every kernel FA4's backward launches with programmatic dependent launch
waits for its predecessor (compile-only, no GPU).

A kernel launched with PDL may start while the kernel before it on its stream is still running
(Note [Early trigger], ``kernels/pdl_producer.py``); it must execute ``griddepcontrol.wait``
before it reads what that kernel wrote. Which of FA4's backward kernels are launched with PDL is
read from FA4's source (:func:`fa4verify.races.pdl_in_source`: ``use_pdl=`` in the launch); each
such kernel's compiled PTX must contain ``griddepcontrol.wait``. This is a necessary condition,
checked without timing: it catches a wait that was dropped (the planted
``bwd_preprocess_pdl_wait_dropped`` and ``bwd_sm90_lse_pdl_wait_dropped`` of
``fa4verify.races.RACE_MUTANTS``, which no GPU run has caught by timing); it does not prove that
the wait comes before every read (``races.production`` judges that on the GPU).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PdlRow", "pdl_rows", "kernel_module", "census_key", "cached_rows"]


def kernel_module(name: str) -> str:
    """FA4's source file of a dumped kernel (``...flash_attncuteflash_bwd_sm90FlashAttention...``
    -> ``flash_bwd_sm90.py``), or "" when the name does not say."""
    m = re.search(r"flash_attncute(flash_[a-z0-9_]+?)(?=FlashAttention|_object|$)", name)
    return f"{m.group(1)}.py" if m else ""


@dataclass
class PdlRow:
    arch: str
    kernel: str
    module: str
    pdl: bool                 #: launched with PDL (FA4's source)
    waits: int                #: griddepcontrol.wait sites in its PTX
    triggers: int             #: griddepcontrol.launch_dependents sites
    status: str = field(init=False)

    def __post_init__(self) -> None:
        self.status = "fail" if (self.pdl and self.waits == 0) else "pass"

    def row(self) -> list[Any]:
        return [self.arch, self.module or self.kernel[:60], "yes" if self.pdl else "no", self.waits,
                self.triggers, self.status]


COLUMNS = ["arch", "kernel (FA4 source)", "launched with PDL", "griddepcontrol.wait", "launch_dependents",
           "verdict"]


def pdl_rows(res: Any, pdl_files: dict[str, bool]) -> list[PdlRow]:
    """One row per backward kernel of a compiled case (:class:`fa4verify.compile.census.CaseResult`)."""
    rows = []
    for k in res.kernels:
        mod = kernel_module(k.name)
        if not mod.startswith("flash_bwd"):
            continue
        ptx = k.ptx or ""
        rows.append(PdlRow(res.case.arch, k.name, mod, bool(pdl_files.get(mod, False)),
                           len(re.findall(r"\bgriddepcontrol\.wait\b", ptx)),
                           len(re.findall(r"\bgriddepcontrol\.launch_dependents\b", ptx))))
    return rows


# Note [Census cache]
# -------------------
# The PTX of a compile-only case is a function of FA4's source, the CuTe DSL that compiles it and
# fa4verify's compile driver, nothing else (no GPU, no inputs). ``census.pdl_waits`` compiles two
# backward cases (sm_90a, sm_100a), ~20 s on 2 cores and ~50 s on a busy 16-core GPU host: on the
# H200 it was the largest item of a warm default audit (46 s of 76 s, measured at 4fa734e). The
# per-kernel counts it reads from the PTX (waits, triggers) are kept under the audit's kernel
# cache (``CheckContext.kernel_cache``; the check runs in the audit's own process, where FA4's
# cache switches are not set), keyed by a digest of every file of the FA4 package that is
# imported (a planted copy on PYTHONPATH has its own digest), the versions of the DSL's and quack's
# distributions, FA4's and the DSL's environment switches and the driver's source (the check's
# case, the compile driver, the adapter, this module); whether a kernel is launched with PDL is
# re-read from FA4's source on every run. A hit is named in the check's notes and its metric
# ``archs_from_cache``; a miss or an unreadable entry compiles as before.

def census_key(arch: str) -> str | None:
    """The cache key of the PDL census of ``arch`` (Note [Census cache]), or None when FA4's
    source cannot be read."""
    import hashlib
    from importlib import metadata
    from pathlib import Path

    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    if d is None:
        return None
    import os
    import sys

    from fa4verify.compile import census as _census
    from fa4verify.kernels import adapter as _adapter
    h = hashlib.sha256(f"pdl-census/1\0{arch}\0".encode())
    dists = sorted({(dm.metadata["Name"] or "").lower(): dm.version for dm in metadata.distributions()
                    if (dm.metadata["Name"] or "").lower().startswith(("nvidia-cutlass-dsl", "quack-kernels"))
                    }.items())
    h.update(repr(dists).encode())
    # FA4's and the DSL's own switches that can change what compiles (tile overrides and the like)
    h.update(repr(sorted((k, v) for k, v in os.environ.items()
                         if k.startswith(("FLASH_ATTENTION_", "FA_", "CUTE_DSL_")))).encode())
    # the driver: the case (the check), how it is compiled (census, adapter), how it is read (here)
    check = sys.modules.get("fa4verify.checks.census")
    driver = [Path(__file__), Path(_census.__file__), Path(_adapter.__file__)]
    driver += [Path(check.__file__)] if check is not None and getattr(check, "__file__", None) else []
    for p in driver + sorted(Path(d).rglob("*.py")):
        h.update(str(p.relative_to(d) if p.is_relative_to(d) else p.name).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:32]


def cached_rows(arch: str, cache_dir: str | None, compile_rows, pdl_files: dict[str, bool]
                ) -> tuple[list[PdlRow], bool]:
    """(rows, from_cache) of ``arch``'s PDL census: read from ``cache_dir`` when an entry of this
    FA4 source, DSL and driver is there, else ``compile_rows()`` (a list of :class:`PdlRow`),
    stored. ``pdl`` of every row is re-read from ``pdl_files`` (FA4's source, this run)."""
    import json
    import os
    from pathlib import Path

    key = census_key(arch) if cache_dir else None
    path = Path(cache_dir, "fa4verify-census", f"pdl-{arch}-{key}.json") if key else None
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            return [PdlRow(arch, r["kernel"], r["module"], bool(pdl_files.get(r["module"], False)),
                           int(r["waits"]), int(r["triggers"])) for r in data["rows"]], True
        except (OSError, ValueError, KeyError, TypeError):
            pass                                  # unreadable: compile again, overwrite
    rows = compile_rows()
    if path is not None:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)   # inside a private cache
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"rows": [{"kernel": r.kernel, "module": r.module, "waits": r.waits,
                                                 "triggers": r.triggers} for r in rows]}))
            os.replace(tmp, path)
        except OSError:
            pass                                  # a read-only cache: the verdict stands without it
    return rows, False
