"""Launch-order races of FA4's backward (Note [Backward under load]).

Note [Backward under load]
--------------------------
FA4's backward is a chain of kernels (preprocess: D = rowsum(dO * O) and the LSE in log2;
the main kernel; the dQ postprocess), launched with programmatic dependent launch where FA4
compiles it (``use_pdl``: ``flash_bwd_preprocess.py``, ``flash_bwd_sm90.py``), each reading what an
earlier one wrote. A missing wait shows only while the producer is still running. fa4verify's other
checks call the backward on an idle GPU with dO copied from the host long before.

:class:`RacingTarget` runs FA4's backward the way a training step does: dO is written by the kernel
launched immediately before FA4's backward on the same stream (a device-side copy from a staging
buffer), and optionally a concurrent memory-bound stream keeps the GPU busy (``busy``: copies of a
``BUSY_MB`` buffer on a side stream, launched before and left running during the backward). Every
repetition is judged by the one judge (:func:`fa4verify.fuzz.properties.check_problem`: runs,
backward within its budget); with ``deterministic=True`` every repetition must also equal the first
bitwise (dQ, dK, dV). :func:`run_races` runs a list of problems (dense, GQA, block-sparse call
forms) ``reps`` times each and returns the verdict rows.

PDL on and off (Note [PDL off]): :func:`run_races` runs FA4 as it ships (PDL where it compiles
it); :func:`run_races_pdl_off` runs the same problems in a process of its own with PDL forced off.
On the CPU the stream and the busy copies are no-ops (tests run the plumbing against a fake FA4
release).

Power, measured on the H200 (2026-12-02, ``docs/results/h200/planted/``): the planted
``bwd_sm90_lse_pdl_wait_dropped`` was NOT caught (16 repetitions under load, PDL on, every one
within budget and bitwise equal, as the clean control). The likely reason is the caching
allocator, not the timing: the repetitions are identical, so the block a repetition gets for D
and the LSE in log2 still holds the previous repetition's values -- the right ones -- and a read
before the preprocess wrote them reads correct numbers. The next step (not built: it needs a GPU
to show it raises no false alarm on the clean kernels): fill the allocator's freed blocks with NaN
between repetitions, so a read-before-write reads NaN.

Note [PDL off]
--------------
FA4 4.0.0b36 has no switch for PDL: no argument, no environment variable, no module flag.
``flash_bwd_preprocess.py:65`` sets ``self.use_pdl = BaseDSL._get_dsl().get_arch_enum() >=
Arch.sm_90a`` (the CuTe DSL's compile arch: on for every arch FA4's backward runs on);
``flash_bwd_sm90.py:628`` launches the SM90 main kernel with a literal ``use_pdl=True``; the
forward's ``enable_pdl`` is forced off (``interface.py:4644-4645`` "Override enable_pdl (not
supported yet)", ``interface.py:4958`` ``enable_pdl=False``). The CuTe DSL turns the launch's
``use_pdl`` into the launch attribute "programmatic stream serialization allowed"
(``cutlass_dsl/cutlass.py``, ``CutlassBaseDSL.cuda_launch_func`` ->
``launch_cfg_programmatic_stream_serialization_allowed``) when it compiles the launcher: it is
baked into the compiled kernel, not read at run time. So fa4verify turns PDL off itself
(:func:`force_pdl_off`): ``cuda_launch_func`` wrapped to pass ``use_pdl=False``, before any
kernel is compiled; the kernels' ``griddepcontrol`` instructions stay and are no-ops without
the attribute (every kernel starts after the previous one of its stream has finished).

Compile-only on sm_90a (tests/test_races.py): FA4's backward asks for PDL on the preprocess and
the main kernel (not the dQ postprocess); after :func:`force_pdl_off` the DSL builds all three
without.

No kernel may be shared between the two runs: FA4's compile keys (``interface.py``
``compile_key`` tuples) carry no PDL element, and its persistent kernel cache
(``cache_utils.get_jit_cache``) is keyed by the compile key and a fingerprint of FA4's source,
which the wrapper does not change; a hit there skips the trace, so the wrapper is never reached.
(The CuTe DSL's own file cache is keyed by a hash of the traced IR, ``base_dsl/dsl.py``
``get_module_hash``, which carries the launch attribute: it cannot serve one run's kernel to the
other.) So the PDL-off run is a fresh process (empty in-memory
caches; :func:`_pdl_off_call` refuses to run when FA4 has compiled anything before the wrapper)
with a kernel cache directory of its own (:func:`pdl_off_env`: ``<FA4's cache dir>-pdl-off``).

Planted faults (:data:`RACE_MUTANTS`, GPU): a dropped wait in the backward's launch chain, in a
private patched copy of FA4 (:mod:`fa4verify.mutants.source`, Note [Private FA4 copy]) --
``python -m fa4verify.races plant ID DEST`` makes the copy and prints the environment to run
``fa4verify audit -k races.production`` under. Two with PDL (the preprocess's
``griddepcontrol_wait`` before it reads O, dO and LSE; the SM90 main kernel's before it reads
LSE and D) and one without (the deterministic GQA dK semaphore wait of the SM90 backward). With
PDL off the two PDL waits guard nothing (each kernel starts after its predecessor has finished):
the PDL-off run is their control; the semaphore wait matters in both.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Optional, Sequence

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.targets import ProductionTarget
from fa4verify.errors import HarnessError, Unsupported

__all__ = ["RacingTarget", "race_problems", "run_races", "run_races_pdl_off", "force_pdl_off", "pdl_off_env",
           "pdl_in_source", "BUSY_MB", "RaceRow", "RACE_MUTANTS", "plant", "PDL_OFF_CACHE_SUFFIX"]

#: the busy stream's buffer (MiB): copies of it keep the memory system loaded for ~0.1 ms each
BUSY_MB = 256


def pdl_in_source() -> dict[str, bool]:
    """Whether the installed FA4's backward kernels launch with PDL: ``{file: use_pdl found}``."""
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    out: dict[str, bool] = {}
    if d is None:
        return out
    for f in ("flash_bwd_preprocess.py", "flash_bwd_sm90.py", "flash_bwd_sm100.py", "flash_bwd_postprocess.py"):
        p = d / f
        if p.is_file():
            text = p.read_text()
            out[f] = "use_pdl=True" in text or "use_pdl=self.use_pdl" in text
    return out


#: the PDL-off run's kernel cache directory: FA4's own, with this suffix (Note [PDL off])
PDL_OFF_CACHE_SUFFIX = "-pdl-off"
#: set by :func:`force_pdl_off` in the process it ran in
_PDL_FORCED_OFF = False


def force_pdl_off() -> None:
    """Every kernel the CuTe DSL compiles from now on in this process launches without PDL
    (Note [PDL off]): ``CutlassBaseDSL.cuda_launch_func`` passes ``use_pdl=False``. Kernels
    compiled before keep their attribute: call it before FA4 compiles anything."""
    global _PDL_FORCED_OFF
    from cutlass.cutlass_dsl import cutlass as dsl
    orig = dsl.CutlassBaseDSL.cuda_launch_func
    if getattr(orig, "_fa4verify_pdl_off", False):
        return

    def cuda_launch_func(*args, **kw):
        kw["use_pdl"] = False
        return orig(*args, **kw)
    cuda_launch_func._fa4verify_pdl_off = True          # type: ignore[attr-defined]
    cuda_launch_func.__wrapped__ = orig                  # type: ignore[attr-defined]
    dsl.CutlassBaseDSL.cuda_launch_func = staticmethod(cuda_launch_func)
    _PDL_FORCED_OFF = True


def pdl_off_env(env: Optional[dict] = None) -> dict[str, str]:
    """The variables of the PDL-off process (Note [PDL off]): FA4's kernel cache directory (the
    one ``env`` -- default this process's -- gives FA4, else FA4's default) with
    :data:`PDL_OFF_CACHE_SUFFIX`, so no PDL-on kernel is ever loaded there."""
    import getpass
    import os
    import tempfile
    env = dict(os.environ if env is None else env)
    base = env.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), getpass.getuser(), "flash_attention_cute_dsl_cache")   # cache_utils' default
    return {"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": base.rstrip(os.sep) + PDL_OFF_CACHE_SUFFIX}


def _compiled_kernels() -> int:
    """Kernels in FA4's in-memory compile caches of this process (0 before the first compile)."""
    from fa4verify.kernels.adapter import fa4_interface
    fa = fa4_interface()
    n = 0
    for name in dir(fa):
        cache = getattr(getattr(fa, name, None), "compile_cache", None)
        if cache is None:
            continue
        mem = getattr(cache, "cache", cache)
        n += len(mem) if hasattr(mem, "__len__") else 0
    return n


def _race_mutants():
    from fa4verify.mutants.source import Edit, SourceMutant
    return (
        SourceMutant("bwd_preprocess_pdl_wait_dropped",
                     "backward preprocess reads O, dO and LSE without griddepcontrol_wait (PDL)",
                     (Edit("flash_bwd_preprocess.py",
                           "        if const_expr(self.use_pdl):\n            cute.arch.griddepcontrol_wait()\n", ""),),
                     "bwd", ("D", "dq", "dk")),
        SourceMutant("bwd_sm90_lse_pdl_wait_dropped",
                     "SM90 backward loads LSE and D without waiting for the preprocess (PDL)",
                     (Edit("flash_bwd_sm90.py",
                           "                        # Wait for bwd preprocess to finish writing LSE and dPsum\n"
                           "                        cute.arch.griddepcontrol_wait()\n",
                           "                        # (planted: no wait for the bwd preprocess)\n"),),
                     "bwd", ("dq", "dk", "dv")),
        SourceMutant("bwd_sm90_dk_semaphore_wait_dropped",
                     "SM90 deterministic GQA backward accumulates dK without waiting for its turn (no PDL)",
                     (Edit("flash_bwd_sm90.py",
                           "                barrier.wait_eq(mdK_semaphore_cur.iterator, tidx, 0, lock_value)\n",
                           "                pass  # planted: no dK semaphore wait\n"),),
                     "bwd", ("dk",), determinism=True),
    )


#: planted dropped waits of the backward's launch chain (Note [Backward under load])
RACE_MUTANTS = _race_mutants()


def plant(mutant_id: str, dest) -> dict[str, str]:
    """A private FA4 copy with the race mutant ``mutant_id`` (:data:`RACE_MUTANTS`) under ``dest``;
    returns the environment that runs it (the copy first on PYTHONPATH, its own kernel cache)."""
    from pathlib import Path

    from fa4verify.mutants import source as sm
    by = {m.id: m for m in RACE_MUTANTS}
    if mutant_id not in by:
        raise ValueError(f"race mutant {mutant_id!r}: expected one of {sorted(by)}")
    copy = sm.make_copy(by[mutant_id], Path(dest))
    env = sm.worker_env(copy, Path(dest) / "kernel-cache")
    return {k: env[k] for k in ("PYTHONPATH", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FA4VERIFY_PRIVATE_FA4")}


def _main(argv: list[str]) -> int:
    """``plant ID DEST``: print the ``export`` lines that run the audit on the planted copy."""
    import sys
    if len(argv) != 3 or argv[0] != "plant":
        print("usage: python -m fa4verify.races plant {" + ",".join(m.id for m in RACE_MUTANTS) + "} DEST",
              file=sys.stderr)
        return 2
    try:
        env = plant(argv[1], argv[2])
    except Exception as e:  # noqa: BLE001 - a bad id or an edit that no longer applies: one line
        print(f"fa4verify races: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for k, v in env.items():
        print(f"export {k}={v}")
    return 0


class _RacingAdapter:
    """The adapter with its ``backward`` preceded by the dO-producing kernel (and the busy stream)."""

    def __init__(self, inner: Any, owner: "RacingTarget") -> None:
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def backward(self, q, k, v, out, dout, lse, **kw):
        dout = self._owner._produce(dout)
        return self._inner.backward(q, k, v, out, dout, lse, **kw)


class RacingTarget(ProductionTarget):
    """Production FA4 whose backward reads a dO written by the kernel launched just before it, with
    an optional concurrent memory-bound stream (Note [Backward under load])."""

    def __init__(self, *, busy: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.busy = bool(busy)
        self._ad = _RacingAdapter(self._ad, self)
        self._side = None
        self._busy_buf = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(busy_stream=self.busy, dout_producer="device copy launched just before the backward",
                 pdl=("forced off at the CuTe DSL launch (Note [PDL off])" if _PDL_FORCED_OFF
                      else "as FA4 compiles it"), pdl_in_source=pdl_in_source())
        return d

    def _produce(self, dout):
        torch = self._torch
        if dout is None or self.fake or not getattr(dout, "is_cuda", False):
            return None if dout is None else dout.clone()
        if self.busy:
            if self._side is None:
                self._side = torch.cuda.Stream()
                n = BUSY_MB * 2**20 // 4
                self._busy_buf = (torch.empty(n, device=dout.device), torch.empty(n, device=dout.device))
            cur = torch.cuda.current_stream()
            self._side.wait_stream(cur)
            with torch.cuda.stream(self._side):
                for _ in range(4):               # left running while FA4's backward starts
                    self._busy_buf[0].copy_(self._busy_buf[1])
        staged = torch.empty_like(dout)
        staged.copy_(dout)                       # the producer: the kernel right before FA4's
        return staged


@dataclasses.dataclass
class RaceRow:
    problem: str
    reps: int
    judged: int = 0
    unsupported: int = 0
    errors: int = 0
    violations: int = 0
    bitwise_mismatches: int = 0
    first_failure: Optional[str] = None

    def row(self) -> list:
        return [self.problem, self.reps, self.judged, self.violations, self.bitwise_mismatches,
                self.unsupported, self.errors, (self.first_failure or "")[:160]]


COLUMNS = ["problem", "reps", "judged", "violations", "bitwise mismatches (deterministic)", "unsupported",
           "fa4verify errors", "first failure"]


def race_problems(arch: str, dtype: str = "bf16", *, seed: int = 0) -> list[AttentionProblem]:
    """Dense MHA (causal), GQA 4:1 and a block-sparse call form: the backward's three shapes of
    launch chain (dense, GQA accumulation, block-sparse Q-direction)."""
    from fa4verify.problem import CallForm, ValueSpec
    vs = ValueSpec("normal", int(seed))
    out = [AttentionProblem(arch=arch, dtype=dtype, batch=2, seqlen_q=512, seqlen_k=512, nheads=4, nheads_kv=4,
                            head_dim=128, head_dim_v=128, causal=True, values=vs),
           AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=384, seqlen_k=640, nheads=8, nheads_kv=2,
                            head_dim=64, head_dim_v=64, values=vs)]
    out.append(AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=512, seqlen_k=512, nheads=2,
                                nheads_kv=2, head_dim=128, head_dim_v=128, values=vs,
                                call=CallForm(block_size=(128, 128), block_keep=0.5, block_seed=int(seed))))
    return out


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def run_races(target: Any, problems: Sequence[AttentionProblem], *, reps: int = 4,
              deterministic: bool = True) -> list[RaceRow]:
    """Each problem ``reps`` times through ``target``'s backward under load, each repetition judged
    by the one judge; with ``deterministic``, every repetition's dQ/dK/dV must equal the first's
    bitwise."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    rows: list[RaceRow] = []
    for p in problems:
        r = RaceRow(p.describe(), int(reps))
        first: Optional[str] = None
        grads: dict[str, Any] = {}
        orig_backward = target.backward

        def capture(problem, a, fwd, **kw):
            g = orig_backward(problem, a, fwd, **kw)
            grads["g"] = g
            return g
        target.backward = capture
        try:
            for _ in range(int(reps)):
                grads.clear()
                try:
                    check_problem(p, target, properties=("runs", "bwd_budget"), backward=True,
                                  deterministic=deterministic)
                except Unsupported as e:
                    r.unsupported += 1
                    r.first_failure = r.first_failure or f"unsupported: {e}"
                    continue
                except HarnessError as e:
                    r.errors += 1
                    r.first_failure = r.first_failure or f"fa4verify error: {e}"
                    continue
                except Violation as v:
                    r.violations += 1
                    r.first_failure = r.first_failure or f"{v.prop}: {v.message}"
                    continue
                r.judged += 1
                if deterministic and "g" in grads:
                    g = grads["g"]
                    d = _digest(g.dq, g.dk, g.dv)
                    if first is None:
                        first = d
                    elif d != first:
                        r.bitwise_mismatches += 1
                        r.first_failure = r.first_failure or "deterministic backward differs bitwise under load"
        finally:
            del target.backward
        rows.append(r)
    return rows


def _pdl_off_call(payload: dict) -> dict:
    """The PDL-off run, in the fresh process :func:`run_races_pdl_off` starts: PDL forced off
    before FA4 compiles anything, then :func:`run_races` per mode. ``{"rows": {mode: [RaceRow]},
    "target": describe(), "kernel_cache": FA4's cache dir here}``."""
    import os
    if _compiled_kernels():
        raise HarnessError("the PDL-off process holds FA4 kernels compiled before PDL was turned off")
    force_pdl_off()
    tgt = RacingTarget(busy=bool(payload.get("busy", True)))
    probs = [AttentionProblem.from_dict(d) for d in payload["problems"]]
    rows = {mode: run_races(tgt, probs, reps=int(payload["reps"]), deterministic=det)
            for mode, det in payload["modes"]}
    return {"rows": rows, "target": tgt.describe(),
            "kernel_cache": os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")}


def run_races_pdl_off(problems: Sequence[AttentionProblem], *, reps: int,
                      modes: Sequence[tuple[str, bool]] = (("deterministic", True), ("default", False)),
                      timeout_s: Optional[float] = None, busy: bool = True) -> dict:
    """:func:`run_races` of ``problems`` in each of ``modes`` ((name, deterministic) pairs) with
    PDL off, in a fresh process with its own kernel cache (Note [PDL off]); the result of
    :func:`_pdl_off_call`. Raises :class:`HarnessError` when that process fails."""
    from fa4verify.run.engine import run_calls
    payload = {"problems": [p.to_dict() for p in problems], "reps": int(reps), "modes": [list(m) for m in modes],
               "busy": bool(busy)}
    out, = run_calls("fa4verify.races:_pdl_off_call", [payload], envs=[pdl_off_env()], timeout_s=timeout_s)
    if not out.ok:
        raise HarnessError(f"the PDL-off process: {out.error}")
    return out.value


if __name__ == "__main__":
    import sys
    sys.exit(_main(sys.argv[1:]))
