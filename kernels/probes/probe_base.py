"""Shared launcher for the probe kernels (holds no probe itself).

Every ``probe_<name>.py`` module in this package runs ONE of FA4's own device functions over
arbitrary fp32 arrays.  Each module defines a ``@cute.kernel`` that reads ``x = gX[i]`` at thread
index ``i = block_idx * block_dim + thread_idx`` and writes the device function's result, a
``@cute.jit`` host ``launch`` function, and the module-level metadata

* ``STAGE``   -- the FA4 numeric stage the probe isolates (fa4_numerics.md section),
* ``MIRRORS`` -- ``file::function`` in ``flash_attn/cute`` whose code the kernel calls,
* ``ARCHS``   -- the archs it may be compiled for (``sm_90a`` probes also *run* on the H200),
* ``VARIANTS`` -- the compile-time variants (e.g. polynomial degrees),
* ``run(x, variant)`` (GPU) and ``compile_only(variant, n)`` (any machine).

This module holds what they share: chunking (shapes are static, one compile per chunk size and
variant), conversion of torch tensors with ``cutlass.cute.runtime.from_dlpack``, and the
compile-only path used on the CPU (``CUTE_DSL_ARCH`` must be set by the caller *before* the DSL
is imported; :func:`compile_in_subprocess` does that).

Nothing here imports ``flash_attn`` or ``cutlass`` at module level.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

#: Threads per block of every probe kernel.
BLOCK = 256
#: Default elements per launch (static shape of one compiled kernel). 2^24 fp32 = 64 MiB.
DEFAULT_CHUNK = 1 << 24

#: All probe modules, in a stable order: name -> module path.
PROBES: dict[str, str] = {
    "ex2_emulation": "fa4verify.kernels.probes.probe_ex2_emulation",
    # the packed probe; "ex2_emulation_2" (FA4's function name) is the key recorded evidence and
    # the census use, "ex2_emulation_packed" says what it is; both load the same module
    "ex2_emulation_2": "fa4verify.kernels.probes.probe_ex2_emulation_packed",
    "ex2_emulation_packed": "fa4verify.kernels.probes.probe_ex2_emulation_packed",
    "fma_packed": "fa4verify.kernels.probes.probe_fma_packed",
    "mufu_ex2": "fa4verify.kernels.probes.probe_mufu_ex2",
    "mufu_tanh": "fa4verify.kernels.probes.probe_mufu_tanh",
    "cvt": "fa4verify.kernels.probes.probe_cvt",
    "rcp": "fa4verify.kernels.probes.probe_rcp",
    "log2": "fa4verify.kernels.probes.probe_log2",
    "exparg": "fa4verify.kernels.probes.probe_exparg",
}


def load(name: str):
    """Import and return the probe module ``name`` (a key of :data:`PROBES`)."""
    try:
        return importlib.import_module(PROBES[name])
    except KeyError:
        raise ValueError(f"unknown probe {name!r}; known: {sorted(PROBES)}") from None


@dataclass(frozen=True)
class Artifacts:
    """Compile-only products of one probe compile (text, never run)."""
    probe: str
    variant: str
    arch: str
    ptx: str
    sass: str


def torch_dtype(cutlass_dtype_name: str):
    import torch
    return {"f32": torch.float32, "i32": torch.int32, "bf16": torch.bfloat16,
            "f16": torch.float16}[cutlass_dtype_name]


def to_cute(t):
    """torch tensor (CPU or CUDA, contiguous, 1-D) -> cute tensor, 16-byte aligned."""
    from cutlass.cute.runtime import from_dlpack
    return from_dlpack(t, assumed_align=16)


class ChunkRunner:
    """Runs an elementwise probe over arrays of any length in fixed-size chunks.

    ``launch`` is the probe's ``@cute.jit`` host function taking ``(*inputs, *outputs,
    *scalars)`` cute tensors; ``out_specs`` gives, per output, ``(dtype_name, elems_per_input)``
    where ``elems_per_input`` is 1 or 0.5 (packed bf16x2 written as one int32 per input pair).
    The compiled function is cached per (chunk, variant). Inputs are padded with zeros to a
    multiple of the chunk (outputs of padding are discarded).
    """

    def __init__(self, launch: Callable, out_specs: Sequence[tuple[str, float]],
                 chunk: int = DEFAULT_CHUNK):
        if chunk % (2 * BLOCK):
            raise ValueError(f"chunk must be a multiple of {2 * BLOCK}, got {chunk}")
        self.launch = launch
        self.out_specs = tuple(out_specs)
        self.chunk = chunk
        self._compiled: dict[Any, Any] = {}

    def _alloc_out(self, n: int, device):
        import torch
        outs = []
        for dt, per in self.out_specs:
            outs.append(torch.empty(int(n * per), dtype=torch_dtype(dt), device=device))
        return outs

    def compile(self, inputs, outputs, consts: tuple = (), scalars: tuple = (), options: str | None = None):
        import cutlass.cute as cute
        args = [to_cute(t) for t in (*inputs, *outputs)]
        kw = {} if options is None else {"options": options}
        return cute.compile(self.launch, *args, *scalars, *consts, **kw)

    @staticmethod
    def _invoke(fn, tensors, scalars, consts):
        # The DSL's compiled function binds the ORIGINAL signature (Constexpr arguments
        # included) and drops the Constexpr ones itself; older DSLs took runtime args only.
        try:
            fn(*tensors, *scalars, *consts)
        except Exception:
            if not consts:
                raise
            fn(*tensors, *scalars)

    def __call__(self, inputs: Sequence, consts: tuple = (), scalars: tuple = ()) -> list:
        """Run on CUDA tensors ``inputs`` (equal-length float32, 1-D); returns output tensors."""
        import torch
        n = int(inputs[0].numel())
        device = inputs[0].device
        if any(int(t.numel()) != n for t in inputs):
            raise ValueError("all probe inputs must have the same length")
        chunk = self.chunk if n >= self.chunk else max(2 * BLOCK, -(-n // (2 * BLOCK)) * 2 * BLOCK)
        total = -(-n // chunk) * chunk
        padded = []
        for t in inputs:
            t = t.contiguous().reshape(-1)
            if total != n:
                t = torch.cat([t, torch.zeros(total - n, dtype=t.dtype, device=device)])
            padded.append(t)
        outs = self._alloc_out(total, device)
        key = (chunk, consts)
        for s in range(0, total, chunk):
            ins_c = [t[s:s + chunk] for t in padded]
            outs_c = [o[int(s * per):int((s + chunk) * per)] for o, (_, per) in zip(outs, self.out_specs)]
            if key not in self._compiled:
                self._compiled[key] = self.compile(ins_c, outs_c, consts, scalars)
            self._invoke(self._compiled[key], [to_cute(t) for t in (*ins_c, *outs_c)], scalars, consts)
        return [o[:int(n * per)] for o, (_, per) in zip(outs, self.out_specs)]


def compile_only_here(launch: Callable, in_dtypes: Sequence[str], out_specs: Sequence[tuple[str, float]],
                      consts: tuple = (), scalars: tuple = (), n: int = 4 * BLOCK,
                      dump_dir: str | os.PathLike | None = None) -> tuple[str, str]:
    """Compile ``launch`` on CPU tensors of length ``n`` for the arch in ``CUTE_DSL_ARCH``.

    Returns ``(ptx, sass)`` text. ``CUTE_DSL_ARCH``, ``CUTE_DSL_KEEP=ptx,cubin,sass`` and an
    existing ``CUTE_DSL_DUMP_DIR`` must be set before cutlass is first imported (use
    :func:`compile_in_subprocess`). SASS is read from the dump directory (empty string when
    nvdisasm is missing).
    """
    import torch
    import cutlass.cute as cute
    ins = [torch.zeros(n, dtype=torch_dtype(d)) for d in in_dtypes]
    outs = [torch.zeros(int(n * per), dtype=torch_dtype(d)) for d, per in out_specs]
    runner = ChunkRunner(launch, out_specs, chunk=max(2 * BLOCK, n))
    dump = Path(dump_dir or os.environ.get("CUTE_DSL_DUMP_DIR", "."))
    import time as _time
    t0 = _time.time_ns() - 1_000_000   # 1 ms slack for coarse file-system clocks
    compiled = runner.compile(ins, outs, consts, scalars)
    ptx = getattr(compiled, "__ptx__", None) or ""
    # A same-signature kernel overwrites an earlier dump, so select by write time, not by name.
    new_sass = sorted((p for p in dump.glob("*.sass") if p.stat().st_mtime_ns >= t0),
                      key=lambda p: p.stat().st_mtime_ns)
    sass = new_sass[-1].read_text() if new_sass else ""
    del cute
    return ptx, sass


def compile_in_subprocess(probe: str, variant: str, arch: str, workdir: str | os.PathLike,
                          timeout: float = 300.0) -> Artifacts:
    """Compile probe ``probe`` variant ``variant`` for ``arch`` (``sm_90a``/``sm_100a``) in a fresh
    Python process (so ``CUTE_DSL_*`` env vars apply cleanly) and return its PTX and SASS.

    Works without a GPU. Raises ``RuntimeError`` with the child's stderr tail on failure.
    """
    workdir = Path(workdir)
    dump = workdir / f"{probe}-{variant}-{arch}"
    dump.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"CUTE_DSL_ARCH": arch, "CUTE_DSL_KEEP": "ptx,cubin,sass",
                "CUTE_DSL_DUMP_DIR": str(dump.resolve()),
                "CUTE_DSL_CACHE_DIR": str((workdir / "dsl-cache").resolve())})
    out_json = dump / "result.json"
    code = (
        "import json,sys\n"
        "from fa4verify.kernels.probes import probe_base as pb\n"
        f"m = pb.load({probe!r})\n"
        f"ptx, sass = m.compile_only({variant!r})\n"
        f"json.dump({{'ptx': ptx, 'sass': sass}}, open({str(out_json)!r}, 'w'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0 or not out_json.exists():
        raise RuntimeError(f"compile of probe {probe}[{variant}] for {arch} failed "
                           f"(rc={r.returncode}): {r.stderr[-2000:]}")
    d = json.loads(out_json.read_text())
    return Artifacts(probe, variant, arch, d["ptx"], d["sass"])


def compile_many_in_subprocess(items: Sequence[tuple[str, str]], arch: str,
                               workdir: str | os.PathLike, timeout: float = 600.0) -> list[Artifacts]:
    """Like :func:`compile_in_subprocess` for several ``(probe, variant)`` pairs in ONE child
    process (imports paid once). Each compile gets its own dump directory."""
    workdir = Path(workdir)
    base = (workdir / f"many-{arch}").resolve()
    base.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"CUTE_DSL_ARCH": arch, "CUTE_DSL_KEEP": "ptx,cubin,sass",
                "CUTE_DSL_DUMP_DIR": str(base),
                "CUTE_DSL_CACHE_DIR": str((workdir / "dsl-cache").resolve())})
    out_json = base / "result.json"
    code = (
        "import json, os, sys\n"
        "from pathlib import Path\n"
        "from fa4verify.kernels.probes import probe_base as pb\n"
        f"items = {list(map(list, items))!r}\n"
        f"base = Path({str(base)!r})\n"
        "res = []\n"
        "for probe, variant in items:\n"
        "    m = pb.load(probe)\n"
        "    ptx, sass = m.compile_only(variant)\n"
        "    res.append({'probe': probe, 'variant': variant, 'ptx': ptx, 'sass': sass})\n"
        f"json.dump(res, open({str(out_json)!r}, 'w'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0 or not out_json.exists():
        raise RuntimeError(f"compile of probes {items} for {arch} failed (rc={r.returncode}): "
                           f"{r.stderr[-2000:]}")
    return [Artifacts(d["probe"], d["variant"], arch, d["ptx"], d["sass"])
            for d in json.loads(out_json.read_text())]
