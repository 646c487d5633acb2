"""Static evidence that FA4 passes a score_mod's ``aux_scalars`` at run time (compile-only, no GPU).

Note [Runtime scalars]
----------------------
FA4 keys its compiled kernels on the *types* of ``aux_scalars`` only (``interface.py``:
``aux_scalar_metadata = tuple(type(s) for s in aux_scalars)``), so a second call with another
value reuses the first call's kernel. That is right only if the value reaches the kernel as a
launch parameter; a value the compiler folds into the code would make every later call of the
process silently use the first value (issue 29's compile-key class of bug). This module compiles
FA4's forward with a score_mod ``score + aux_scalars[0]`` for a value whose fp32 bit pattern is
distinctive (:data:`AUX_VALUE`) and reads the PTX: the value must not appear as an immediate (the
kernel's ``.param .f32`` count is recorded, not judged: a folded value may leave the parameter in
place). A value folded *after arithmetic* (e.g. multiplied by log2 e) would show a different
constant and escape this test: it catches the literal fold, which the planted self-test shows it
sees. No PTX read is undecided, never a pass. It also records whether FA4 compiles the
form its docstring shows, a Python float (FA4 4.0.0b36 + DSL 4.8.1: it does not: the DSL's
argument flattening of ``AuxData`` meets the stream's block argument where the float's should be:
"unable to convert BlockArgument ... to Numeric"; a ``cutlass.Float32`` compiles).

``FA4VERIFY_AUX_PLANT=baked`` (the check's own self-test) writes the value into the score_mod as a
Python constant: the compiler folds it, and the check must then fail.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["AUX_VALUE", "ptx_immediate", "compile_aux", "judge"]

#: fp32 0x3DFCD6EA: a bit pattern no FA4 kernel holds by itself
AUX_VALUE = 0.123456789
PLANT_ENV = "FA4VERIFY_AUX_PLANT"


def ptx_immediate(x: float) -> str:
    """The PTX spelling of ``x`` rounded to fp32 (``0f3DFCD6EA``)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


def _worker(spec_json: str) -> None:
    """In the compile subprocess (env from :func:`fa4verify.compile.census.compile_env`)."""
    spec = json.loads(spec_json)
    from fa4verify.kernels import adapter
    adapter.install_compile_only_shims(int(os.environ["FLASH_ATTENTION_NUM_SMS"]))
    import cutlass
    import cutlass.cute as cute
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    iface = adapter.fa4_interface()
    baked = os.environ.get(PLANT_ENV) == "baked"
    value = float(spec["value"])

    @cute.jit
    def aux_bias(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars=None):
        if cutlass.const_expr(baked):
            return score + value                     # the planted fault: a compile-time constant
        return score + aux_scalars[0]

    scalar = value if spec["form"] == "python" else cutlass.Float32(value)
    out: dict[str, Any] = {"compiled": False, "error": None}
    try:
        with FakeTensorMode():
            q = torch.empty(1, 256, 2, 64, dtype=torch.bfloat16, device="cuda")
            iface._flash_attn_fwd(q, torch.empty_like(q), torch.empty_like(q), score_mod=aux_bias,
                                  aux_scalars=(scalar,), return_lse=True)
        out["compiled"] = True
    except Exception as e:  # noqa: BLE001 - FA4's or the DSL's refusal is the finding
        out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
    Path(spec["result"]).write_text(json.dumps(out))


def compile_aux(arch: str, form: str, workdir: str | os.PathLike | None = None, timeout: float = 600.0
                ) -> dict[str, Any]:
    """Compile FA4's forward for ``arch`` (``sm_90a`` / ``sm_100a``) with ``aux_scalars=(v,)``,
    ``form`` ``"float32"`` (a ``cutlass.Float32``) or ``"python"`` (a float). Returns
    ``{"compiled", "error", "immediate" (the value's fp32 immediate found in the PTX),
    "f32_params" (``.param .f32`` of the forward kernel), "seconds"}``."""
    from fa4verify.compile.census import compile_env
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fa4aux-"))
    dump = (base / f"{arch}-{form}").resolve()
    dump.mkdir(parents=True, exist_ok=True)
    env = compile_env(arch, dump, base / f"dsl-cache-{arch}-{form}", keep="ptx")
    result = dump / "_aux.json"
    spec = json.dumps({"form": form, "value": AUX_VALUE, "result": str(result)})
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c",
                        "import sys; from fa4verify.compile.census_aux import _worker; _worker(sys.argv[1])", spec],
                       env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not result.exists():
        raise RuntimeError(f"aux_scalars compile driver for {arch} ({form}) failed (rc={r.returncode}): "
                           f"{r.stderr[-2000:]}")
    out = json.loads(result.read_text())
    ptx = [p.read_text(errors="replace") for p in dump.glob("*.ptx") if "flash_fwd" in p.name]
    imm = ptx_immediate(AUX_VALUE)
    out.update(immediate=any(imm in t for t in ptx), kernels=len(ptx), seconds=round(time.time() - t0, 1),
               f32_params=max((t.count(".param .f32") for t in ptx), default=0))
    return out


def judge(rows: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(status, summary) from ``{label: compile_aux(...)}``: fail when a compiled kernel holds the
    value as an immediate (folded: a later call with another value would run this one);
    undecided when no Float32 form compiled."""
    unread = [k for k, r in rows.items() if r["compiled"] and not r.get("kernels")]
    if unread:                        # nothing read is nothing shown (the dump was not honoured)
        return "undecided", f"FA4 compiled but no forward PTX was dumped to read ({', '.join(unread)})"
    folded = [k for k, r in rows.items() if r["compiled"] and r["immediate"]]
    compiled = [k for k, r in rows.items() if r["compiled"]]
    py = {k: r for k, r in rows.items() if k.endswith("python")}
    note = "; ".join(f"{k}: a Python float does not compile ({r['error']})" for k, r in py.items()
                     if not r["compiled"])
    if folded:
        return "fail", ("the aux scalar's value is compiled into the kernel (fp32 immediate "
                        f"{ptx_immediate(AUX_VALUE)} in the PTX) while FA4 keys its cache on the scalar's type "
                        f"only: a later call with another value runs this one ({', '.join(folded)})")
    if not any(not k.endswith("python") for k in compiled):
        return "undecided", "no cutlass.Float32 aux scalar compiled: " + "; ".join(
            f"{k}: {r['error']}" for k, r in rows.items())
    return "pass", (f"the aux scalar reaches the kernel as a launch parameter ({', '.join(compiled)}: no "
                    f"immediate {ptx_immediate(AUX_VALUE)})" + (f"; FA4 finding: {note}" if note else ""))
