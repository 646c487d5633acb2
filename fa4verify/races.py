"""Launch-order races of FA4's backward (Note [Backward under load]).

Note [Backward under load]
--------------------------
FA4's backward is a chain of kernels (preprocess: D = rowsum(dO * O) and the LSE in log2;
the main kernel; the dQ postprocess), launched with programmatic dependent launch where FA4
compiles it (``use_pdl``: ``flash_bwd_preprocess.py``, ``flash_bwd_sm90.py``), each reading what an
earlier one wrote. A missing wait shows only while the producer is still running. fa4verify's other
checks call the backward on an idle GPU with dO copied from the host long before.

:class:`RacingTarget` runs FA4's backward the way a training step does: dO is written by the kernel
launched immediately before FA4's backward preprocess on the same stream (launched from a hook on
FA4's ``_bwd_preprocess``: :func:`fa4verify.kernels.stage_taps.before_preprocess`): the kernel of
Note [Early trigger] (``fa4verify.kernels.pdl_producer``), which lets its PDL dependents start at
once and writes dO only after a ~0.5 ms spin, so a preprocess that does not wait reads dO before
it is written (a torch copy where dO is not a contiguous 16-bit CUDA tensor), and optionally a concurrent memory-bound
stream keeps the GPU busy (``busy``: copies of a ``BUSY_MB`` buffer on a side stream, launched just
before the producer and left running during the backward). Every buffer FA4 leaves uninitialised
is NaN-filled first (Note [Poisoned scratch]).
Every repetition is judged by the one judge (:func:`fa4verify.fuzz.properties.check_problem`:
runs, backward within its budget); with ``deterministic=True`` every repetition must also equal
the first bitwise (dQ, dK, dV). :func:`run_races` runs a list of problems (dense, GQA, block-sparse
call forms) ``reps`` times each and returns the verdict rows.

PDL on and off (Note [PDL off]): :func:`run_races` runs FA4 as it ships (PDL where it compiles
it); :func:`run_races_pdl_off` runs the same problems in a process of its own with PDL forced off.
On the CPU the busy stream is a no-op (tests run the plumbing, the poison included, against fake
FA4 releases).

Power, measured on the H200 (2026-12-02, ``docs/results/h200/planted/``, before the poison): the
planted ``bwd_sm90_lse_pdl_wait_dropped`` was NOT caught (16 repetitions under load, PDL on, every
one within budget and bitwise equal, as the clean control). The likely reason is the caching
allocator, not the timing: the repetitions are identical, so the block a repetition gets for D
and the LSE in log2 still holds the previous repetition's values -- the right ones -- and a read
before the preprocess wrote them reads correct numbers. Note [Poisoned scratch] is the answer.

Note [Poisoned scratch]
-----------------------
What: in every backward of :class:`RacingTarget` (``poison=True``, the default; ``--opt
races_poison=off`` turns it off), each buffer FA4's ``_flash_attn_bwd`` allocates uninitialised
holds NaN before the first of FA4's kernels can touch it:

* the preprocess's outputs -- b36: ``dpsum`` (D), ``lse_log2`` and ``dq_accum`` -- are filled in
  the hook on ``_bwd_preprocess`` (which receives them), right before FA4 launches it;
* the gradients ``dq``, ``dk``, ``dv`` are FA4's output buffers passed by the harness
  (``_flash_attn_bwd(dq=, dk=, dv=)``, the adapter's documented buffers), NaN-filled: the
  production target's own (Note [Poisoned gradients]), or the harness's for a caller that gave
  none;
* dO: the staging buffer is NaN-filled before the producer copies the real dO into it.

Then, in stream order: [FA4's own zero-fills: dK/dV accumulators, semaphores] -> the NaN fills ->
the busy stream -> the dO copy -> preprocess (PDL) -> main kernel (PDL) -> postprocess. A kernel
that reads one of these buffers before its producer wrote it reads NaN, whatever the previous
repetition left there, and the NaN reaches dQ/dK/dV: the judge fails it (a NaN against a finite
oracle is over any bound) and the row says what a NaN gradient means (:data:`NAN_MEANS`).

Why it raises no false alarm on a correct FA4: the buffers are the ones FA4 allocates with
``torch.empty``: FA4 promises nothing about their contents, so a correct kernel writes every
element before it reads it (the preprocess writes D and the LSE over the whole rounded length,
+inf/0 in the padding, and zeroes all of ``dq_accum``: ``use_padded_offsets``, b36). The
preprocess waits (``griddepcontrol_wait``) at its very top, before any write, so the fills and the
dO copy launched just before it cannot overwrite its outputs; the main kernel waits for the
preprocess before it loads LSE and D. Buffers FA4 initialises itself (``torch.zeros``: the dK/dV
accumulators of GQA, the deterministic mode's semaphores) are left alone: a NaN or any other
pattern there would be overwritten by FA4's own zero-fill, and a missing semaphore wait is caught,
if at all, by the bitwise comparison of deterministic repetitions.

Which buffers, read from FA4's own source (one place per fact): :func:`fa4verify.kernels.stage_taps.backward_buffers`
parses the installed (or planted) ``interface.py``: the locals of ``_flash_attn_bwd`` assigned,
before its ``_bwd_preprocess`` call and outside branches that return, only from ``torch.empty`` /
``torch.empty_like`` (or None), and which preprocess parameter each reaches. b36: dq, dk, dv,
dq_accum, dpsum, lse_log2, dsink; ``dsink`` (learnable sinks only) reaches neither the hook nor
the caller and is not poisoned (``describe()["poison"]["not_reachable"]``). A release whose
driver is not ``_bwd_preprocess`` or that does not pass it dO gets no hook: dO is produced before
the call and nothing is poisoned (the row's ``poisoned`` count says so: 0).

Why a hook and not the caching allocator: filling blocks of FA4's sizes and freeing them so that
FA4's next requests get them back relies on the allocator handing the same blocks to the same
request sequence from the same state (best fit, split and merge; no allocation in between, per
stream), which holds in practice but cannot be checked for the buffers FA4 never returns; the
hook fills FA4's own tensors, whatever block they came from. What each call poisoned is checked
in code: ``last_poison`` (the hook ran and saw the staged dO, the gradients FA4 returned are the
NaN-filled buffers) and the row's ``poisoned`` count; the hook raises a :class:`HarnessError` if
FA4 copied dO first (the producer would not be the kernel before the preprocess) or if no
preprocess ran (the dO read was never produced).

Measured on the H200 with the torch-copy producer (2026-12-02): poisoned, the clean kernels pass
and the planted dK semaphore wait is caught, but neither planted PDL wait (16/16 repetitions pass):
a torch kernel never triggers its dependents, so FA4's preprocess starts only after dO is written.
Note [Early trigger] is the answer for the preprocess's wait; the main kernel's wait for the
preprocess stays timing-bound (the preprocess triggers right after its loads).

With the early-trigger producer (``bash scripts/gpu.sh planted:race``, 4 repetitions per problem
and mode): the clean kernels pass (16 repetitions within budget, bitwise, poisoned 16/16) and both
planted PDL waits are caught by this check (NaN read from a poisoned buffer) as well as by
``census.pdl_waits`` -- measured on the H200 at 4fa734e (2026-12-02) and on an H100 at 299cd69
(2026-12-05, ``docs/results/h100/session16_299cd69/planted_race/``). The timing still decides
whether a dropped wait is hit within the repetitions; the poison only makes a hit visible.

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

import contextlib
import dataclasses
import hashlib
from typing import Any, Optional, Sequence

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.targets import ProductionTarget
from fa4verify.errors import HarnessError, Unsupported

__all__ = ["RacingTarget", "race_problems", "ROWS_PAST_USED", "run_races", "run_races_pdl_off", "force_pdl_off", "pdl_off_env",
           "pdl_in_source", "BUSY_MB", "RaceRow", "RACE_MUTANTS", "plant", "PDL_OFF_CACHE_SUFFIX"]

#: the busy stream's buffer (MiB): copies of it keep the memory system loaded for ~0.1 ms each
BUSY_MB = 256


def pdl_in_source() -> dict[str, bool]:
    """Whether the installed FA4's backward kernels may launch with PDL: ``{file: found}``, True
    where the file's code (comments aside) passes ``use_pdl=`` anything but the literal ``False``
    (b36: ``use_pdl=self.use_pdl`` in the preprocess, ``use_pdl=True`` in the SM90 main kernel).
    Conservative on purpose: ``census.pdl_waits`` asks every such kernel for a wait."""
    import re
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    out: dict[str, bool] = {}
    if d is None:
        return out
    launch = re.compile(r"(?<![.\w])use_pdl\s*=\s*(?!False\b)\S")
    for f in ("flash_bwd_preprocess.py", "flash_bwd_sm90.py", "flash_bwd_sm100.py", "flash_bwd_postprocess.py"):
        p = d / f
        if p.is_file():
            code = (line.split("#", 1)[0] for line in p.read_text().splitlines())
            out[f] = any(launch.search(line) for line in code)
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
    """The adapter with its ``backward`` under load (:meth:`RacingTarget._backward_under_load`)."""

    def __init__(self, inner: Any, owner: "RacingTarget") -> None:
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def backward(self, q, k, v, out, dout, lse, **kw):
        return self._owner._backward_under_load(self._inner, q, k, v, out, dout, lse, kw)


def _poison(t: Any) -> bool:
    """NaN into every element of ``t`` when it is a floating tensor (True); else nothing (False)."""
    if t is None or not getattr(t, "is_floating_point", lambda: False)():
        return False
    t.fill_(float("nan"))
    return True


class RacingTarget(ProductionTarget):
    """Production FA4 whose backward reads a dO written by the kernel launched just before its
    preprocess, with an optional concurrent memory-bound stream (Note [Backward under load]) and,
    with ``poison``, FA4's uninitialised backward buffers NaN-filled first (Note [Poisoned scratch])."""

    def __init__(self, *, busy: bool = True, poison: bool = True, early_trigger: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.busy = bool(busy)
        self.poison = bool(poison)
        #: dO produced by the kernel of Note [Early trigger] (else a torch copy)
        self.early_trigger = bool(early_trigger)
        #: what produced dO in the last backward: "early-trigger kernel", "torch copy" or None
        self.last_producer: Optional[str] = None
        #: the buffers the last backward NaN-poisoned: {"poisoned", "wanted", "complete"}
        self.last_poison: Optional[dict] = None
        self._ad = _RacingAdapter(self._ad, self)
        self._side = None
        self._busy_buf = None
        self._fa4: Optional[tuple] = None

    def _poisoned(self, q, k, v) -> dict[str, Any]:
        """The gradient buffers of Note [Poisoned gradients] only with :attr:`poison` (``--opt
        races_poison=off`` leaves every buffer as FA4 would allocate it)."""
        return super()._poisoned(q, k, v) if self.poison else {}

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        hooked = self._fa4 is not None and self._fa4[0] is not None and "dout" in self._fa4[1].preprocess.values()
        kind = (f"{self.last_producer} (Note [Early trigger])" if self.last_producer else
                "early-trigger kernel where dO is a contiguous 16-bit CUDA tensor, else a torch copy"
                if self.early_trigger else "torch copy")
        d.update(busy_stream=self.busy,
                 dout_producer=(f"{kind}, launched just before FA4's backward preprocess" if hooked
                                else f"{kind}, launched just before FA4's backward"),
                 pdl=("forced off at the CuTe DSL launch (Note [PDL off])" if _PDL_FORCED_OFF
                      else "as FA4 compiles it"), pdl_in_source=pdl_in_source())
        if self._fa4 is not None:
            bufs = self._fa4[1]
            d["poison"] = ({"off": "races_poison=off"} if not self.poison else {
                "at_preprocess": list(bufs.at_preprocess()), "outputs": list(bufs.outputs),
                "dout": hooked, "not_reachable": list(bufs.unreachable()),
                "read_from": "_flash_attn_bwd's source (Note [Poisoned scratch])"})
        return d

    def _fa4_buffers(self, inner: Any) -> tuple:
        """(FA4's interface module or None, its :class:`BackwardBuffers`), read once per target."""
        if self._fa4 is None:
            from fa4verify.kernels import stage_taps
            iface = None
            get = getattr(inner, "interface_module", None)
            if get is not None:
                iface = get()
            if iface is None or not hasattr(iface, "_bwd_preprocess"):
                self._fa4 = (None, stage_taps.BackwardBuffers(frozenset(), {}, ()))
            else:
                self._fa4 = (iface, stage_taps.installed_backward_buffers(iface))
        return self._fa4

    def _load(self, like) -> None:
        """The busy stream: copies of a :data:`BUSY_MB` buffer launched on a side stream, left
        running while FA4's kernels start (CUDA only)."""
        torch = self._torch
        if not self.busy or not getattr(like, "is_cuda", False):
            return
        if self._side is None:
            self._side = torch.cuda.Stream()
            n = BUSY_MB * 2**20 // 4
            self._busy_buf = (torch.empty(n, device=like.device), torch.empty(n, device=like.device))
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            for _ in range(4):
                self._busy_buf[0].copy_(self._busy_buf[1])

    def _backward_under_load(self, inner: Any, q, k, v, out, dout, lse, kw: dict):
        """FA4's backward with dO produced by the kernel right before its preprocess (the busy
        stream launched just before that) and, with :attr:`poison`, every buffer FA4 leaves
        uninitialised NaN-filled before any of its kernels runs (Note [Poisoned scratch]). Without
        a preprocess to hook (a release without ``_bwd_preprocess``, a stand-in), dO is produced
        before the call and the harness poisons nothing (the target's own NaN-filled gradients,
        Note [Poisoned gradients], are still passed, and not counted)."""
        if dout is None or self.fake:
            return inner.backward(q, k, v, out, None if dout is None else dout.clone(), lse, **kw)
        from fa4verify.kernels import stage_taps
        iface, bufs = self._fa4_buffers(inner)
        dout_param = next((p for p, local in bufs.preprocess.items() if local == "dout"), None)
        hooked = iface is not None and dout_param is not None and q.numel() > 0 and k.numel() > 0
        poisoned: set[str] = set()
        src = dout if dout.is_contiguous() else dout.contiguous()
        staged = self._torch.empty_like(src)
        outs: dict[str, Any] = {}
        given: dict[str, Any] = {}
        if self.poison and hooked:
            if _poison(staged):
                poisoned.add("dout")
            for name, ref in (("dq", q), ("dk", k), ("dv", v)):
                if name not in bufs.outputs:
                    continue
                if kw.get(name) is None:
                    outs[name] = self._torch.empty_like(ref)
                    _poison(outs[name])
                elif kw[name].is_floating_point() and bool(self._torch.isnan(kw[name]).all()):
                    given[name] = kw[name]       # the target's own (Note [Poisoned gradients])
        calls: list[int] = []
        absent: set[str] = set()

        early = False
        if self.early_trigger and getattr(src, "is_cuda", False):     # the CuTe DSL only where a GPU runs
            from fa4verify.kernels import pdl_producer
            early = pdl_producer.supported(src, staged)

        def produce():
            self._load(dout)
            # the producer: the kernel right before FA4's preprocess (Note [Early trigger]: it lets
            # the preprocess start at once and writes dO only after a spin)
            if early:
                pdl_producer.produce(src, staged)
            else:
                staged.copy_(src)
            self.last_producer = "early-trigger kernel" if early else "torch copy"

        def hook(args: dict) -> None:
            calls.append(1)
            if args.get(dout_param) is not staged:
                raise HarnessError("FA4's backward preprocess did not get the dO the race harness produced "
                                   "(FA4 copied it first): the producer cannot be the kernel before it")
            if self.poison:
                for p in bufs.at_preprocess():
                    if args.get(p) is None:          # not allocated in this call (b36: dq_accum of SM100 hd 256)
                        absent.add(p)
                    elif _poison(args[p]):
                        poisoned.add(p)
            produce()

        if not hooked:
            produce()
        with stage_taps.before_preprocess(hook, iface) if hooked else contextlib.nullcontext():
            r = inner.backward(q, k, v, out, staged, lse, **{**kw, **outs})
        if hooked and not calls:
            raise HarnessError("FA4's backward called no preprocess: the dO it read was never produced")
        for name, buf in {**outs, **given}.items():
            if getattr(r, name, None) is buf:
                poisoned.add(name)
        wanted = (set(bufs.at_preprocess()) - absent) | set(bufs.outputs) | {"dout"}
        self.last_poison = {"poisoned": sorted(poisoned), "wanted": sorted(wanted),
                            "complete": bool(self.poison and hooked and wanted <= poisoned)}
        return r


@dataclasses.dataclass
class RaceRow:
    problem: str
    reps: int
    judged: int = 0
    unsupported: int = 0
    errors: int = 0
    violations: int = 0
    bitwise_mismatches: int = 0
    #: repetitions whose backward ran with every uninitialised FA4 buffer NaN-poisoned (Note [Poisoned scratch])
    poisoned: int = 0
    first_failure: Optional[str] = None

    def row(self) -> list:
        return [self.problem, self.reps, self.judged, self.violations, self.bitwise_mismatches, self.poisoned,
                self.unsupported, self.errors, (self.first_failure or "")[:160]]


COLUMNS = ["problem", "reps", "judged", "violations", "bitwise mismatches (deterministic)",
           "poisoned (NaN scratch)", "unsupported", "fa4verify errors", "first failure"]

#: what a NaN gradient of a race repetition means (FA4's scratch was NaN-poisoned first)
NAN_MEANS = ("NaN in {}: a NaN-poisoned buffer was read before its producer wrote it, or never written "
             "(Note [Poisoned scratch])")


def race_problems(arch: str, dtype: str = "bf16", *, seed: int = 0) -> list[AttentionProblem]:
    """Dense MHA (causal), GQA 4:1, used-length Q with a learnable sink, and a block-sparse call
    form: the backward's shapes of launch chain (dense, GQA accumulation, block-sparse Q-direction)
    and of scratch. The third holds Q at a capacity of two M tiles and more past each sequence's
    used rows: FA4's preprocess writes D and the LSE in log2
    only up to the used rows rounded to its tile, so the rows past them hold the poison (Note
    [Poisoned scratch]), and a kernel that reads them -- dsink's loop to the capacity instead of
    ``seqused_q`` (``flash_bwd_postprocess.py``, red-team round 16 #8), an M tile past the used
    length -- reads NaN, where FA4's own ``torch.empty`` hands it whatever the allocator held."""
    from fa4verify.problem import CallForm, ValueSpec
    vs = ValueSpec("normal", int(seed))
    out = [AttentionProblem(arch=arch, dtype=dtype, batch=2, seqlen_q=512, seqlen_k=512, nheads=4, nheads_kv=4,
                            head_dim=128, head_dim_v=128, causal=True, values=vs),
           AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=384, seqlen_k=640, nheads=8, nheads_kv=2,
                            head_dim=64, head_dim_v=64, values=vs),
           AttentionProblem(arch=arch, dtype=dtype, batch=2, seqlen_q=100, seqlen_k=300, nheads=2, nheads_kv=2,
                            head_dim=128, head_dim_v=128, seqlens_q=(100, 37), seqlens_k=(300, 300), sink=True,
                            values=vs, call=CallForm(seqused_q=True, q_capacity=ROWS_PAST_USED))]
    out.append(AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=512, seqlen_k=512, nheads=2,
                                nheads_kv=2, head_dim=128, head_dim_v=128, values=vs,
                                call=CallForm(block_size=(128, 128), block_keep=0.5, block_seed=int(seed))))
    return out


#: Q capacity of the used-length race problem: its longest sequence (100 rows) rounded to a 128-row
#: M tile, and two tiles more (FA4's SM90 backward tiles are at most 128 rows; SM 10.x's 128 too)
ROWS_PAST_USED = 128 + 2 * 128


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _poisoned(target: Any) -> int:
    """1 when ``target``'s last backward ran with every uninitialised FA4 buffer poisoned."""
    lp = getattr(target, "last_poison", None)
    return int(bool(lp and lp.get("complete")))


def _nan_grads(g: Any) -> str:
    """The gradients of ``g`` (a Bwd) that hold a NaN, comma-separated ('' for none)."""
    if g is None:
        return ""
    return ", ".join(n for n in ("dq", "dk", "dv") if getattr(g, n, None) is not None
                     and np.isnan(np.asarray(getattr(g, n), np.float64)).any())


def run_races(target: Any, problems: Sequence[AttentionProblem], *, reps: int = 4,
              deterministic: bool = True) -> list[RaceRow]:
    """Each problem ``reps`` times through ``target``'s backward under load, each repetition judged
    by the one judge; with ``deterministic``, every repetition's dQ/dK/dV must equal the first's
    bitwise. A row counts the repetitions whose FA4 scratch was NaN-poisoned (a
    :class:`RacingTarget`'s ``last_poison``; Note [Poisoned scratch]) and says what a NaN gradient
    means."""
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
                if hasattr(target, "last_poison"):
                    target.last_poison = None
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
                    r.poisoned += _poisoned(target)
                    nan = _nan_grads(grads.get("g"))
                    r.first_failure = r.first_failure or (f"{v.prop}: " + (f"{NAN_MEANS.format(nan)}; " if nan else "")
                                                          + v.message)
                    continue
                r.judged += 1
                r.poisoned += _poisoned(target)
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
    tgt = RacingTarget(busy=bool(payload.get("busy", True)), poison=bool(payload.get("poison", True)))
    probs = [AttentionProblem.from_dict(d) for d in payload["problems"]]
    rows = {mode: run_races(tgt, probs, reps=int(payload["reps"]), deterministic=det)
            for mode, det in payload["modes"]}
    return {"rows": rows, "target": tgt.describe(),
            "kernel_cache": os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")}


def run_races_pdl_off(problems: Sequence[AttentionProblem], *, reps: int,
                      modes: Sequence[tuple[str, bool]] = (("deterministic", True), ("default", False)),
                      timeout_s: Optional[float] = None, busy: bool = True, poison: bool = True) -> dict:
    """:func:`run_races` of ``problems`` in each of ``modes`` ((name, deterministic) pairs) with
    PDL off, in a fresh process with its own kernel cache (Note [PDL off]); the result of
    :func:`_pdl_off_call`. Raises :class:`HarnessError` when that process fails."""
    from fa4verify.run.engine import run_calls
    payload = {"problems": [p.to_dict() for p in problems], "reps": int(reps), "modes": [list(m) for m in modes],
               "busy": bool(busy), "poison": bool(poison)}
    out, = run_calls("fa4verify.races:_pdl_off_call", [payload], envs=[pdl_off_env()], timeout_s=timeout_s)
    if not out.ok:
        raise HarnessError(f"the PDL-off process: {out.error}")
    return out.value


if __name__ == "__main__":
    import sys
    sys.exit(_main(sys.argv[1:]))
