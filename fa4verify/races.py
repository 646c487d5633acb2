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

PDL is as the installed FA4 compiles it (:func:`pdl_in_source` reads ``use_pdl`` from its source);
FA4 has no switch to turn it off at run time. On the CPU the stream and the busy copies are no-ops
(tests run the plumbing against a fake FA4 release).

Planted faults (:data:`RACE_MUTANTS`, GPU): a dropped wait in the backward's launch chain, in a
private patched copy of FA4 (:mod:`fa4verify.source_mutants`, Note [Private FA4 copy]) --
``python -m fa4verify.races plant ID DEST`` makes the copy and prints the environment to run
``fa4verify audit -k races.production`` under. Two with PDL (the preprocess's
``griddepcontrol_wait`` before it reads O, dO and LSE; the SM90 main kernel's before it reads
LSE and D) and one without (the deterministic GQA dK semaphore wait of the SM90 backward).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Optional, Sequence

import numpy as np

from fa4verify._strategies.problem import AttentionProblem
from fa4verify.targets import HarnessError, ProductionTarget, Unsupported

__all__ = ["RacingTarget", "race_problems", "run_races", "pdl_in_source", "BUSY_MB", "RaceRow", "RACE_MUTANTS",
           "plant"]

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


def _race_mutants():
    from fa4verify.source_mutants import Edit, SourceMutant
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

    from fa4verify import source_mutants as sm
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
                 pdl=pdl_in_source())
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
    from fa4verify._strategies.calls import CallForm
    from fa4verify._strategies.values import ValueSpec
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


if __name__ == "__main__":
    import sys
    sys.exit(_main(sys.argv[1:]))
