"""Backends of the determinism check: what the runner needs from a kernel, and the kernels it can
run -- production FA4 and the CPU twin through the target layer (:mod:`fa4verify.targets`), and an fp32
PyTorch reference that exercises the harness on the CPU."""
from __future__ import annotations

import importlib
import inspect
import platform
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from fa4verify.determinism.bitwise import _torch
from fa4verify.determinism.inputs import Problem
from fa4verify.determinism.schema import UNSUPPORTED_MSG
from fa4verify.errors import Unsupported


@dataclass
class Grads:
    """Gradients of one backward run. ``extra``: further tensors the backend exposes and that
    are digested and compared like the gradients (the twin's fp32 ``dq_accum``)."""
    dq: Any
    dk: Any
    dv: Any
    dsink: Any = None
    config: Any = None
    extra: dict = field(default_factory=dict)


class Backend:
    """What the runner needs from a kernel. Subclasses set ``name``, ``where`` (figure label) and
    ``writes_into_buffers`` (True when :meth:`backward` honours the given dq/dk/dv buffers)."""
    name = "abstract"
    where = "CPU"
    writes_into_buffers = False
    arch: str | None = None
    #: how a rejection is reported ("<stage> <unsupported_msg> (...)")
    unsupported_msg = "not supported by the kernel for this configuration"

    def environment(self, device: str) -> dict[str, str]:
        raise NotImplementedError

    def forward(self, p: Problem) -> tuple[Any, Any]:
        raise NotImplementedError

    def backward(self, p: Problem, out, lse, *, deterministic: bool, dq=None, dk=None,
                 dv=None) -> Grads:
        raise NotImplementedError

    def synchronize(self, device: str) -> None:
        pass

    def classify(self, exc: BaseException) -> str:
        """``"unsupported"`` if ``exc`` is the kernel rejecting the configuration, else ``"error"``."""
        if isinstance(exc, Unsupported):
            return "unsupported"
        return "error"


def _common_env() -> dict[str, str]:
    env = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch
        env["torch"] = torch.__version__
    except Exception:  # pragma: no cover
        env["torch"] = "absent"
    return env


def _pkg_version(name: str) -> str:
    from fa4verify.kernels.facts import dist_version
    return dist_version(name) or "absent"


def _driver_version() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
        for tok in line.split():
            if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
                return tok
    except OSError:
        pass
    return "unknown"


def _accepted(fn: Callable, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``kwargs`` that ``fn`` accepts. A keyword it does not accept is an
    error if its value is not the neutral default (None/False/0.0/(None, None)) -- a feature the
    kernel interface cannot express must not be silently dropped."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    use = {}
    for k, v in kwargs.items():
        if k in params:
            use[k] = v
        elif v not in (None, False, 0.0, (None, None)):
            raise TypeError(f"{getattr(fn, '__qualname__', fn)} has no parameter {k!r} "
                            f"(needed: {k}={v!r})")
    return use


def _features(p: Problem) -> dict:
    c = p.cfg
    return dict(softmax_scale=p.softmax_scale, causal=c.causal, window_size=tuple(c.window),
                softcap=c.softcap, learnable_sink=p.sink, cu_seqlens_q=p.cu_seqlens_q,
                cu_seqlens_k=p.cu_seqlens_k, max_seqlen_q=p.max_seqlen_q,
                max_seqlen_k=p.max_seqlen_k)


class Fa4Backend(Backend):
    """Production FA4 through the target layer: :class:`fa4verify.targets.ProductionTarget` (which
    runs ``fa4verify.kernels.adapter``, the only importer of flash_attn.cute) on this harness's own
    tensors and guarded buffers (:meth:`~fa4verify.targets.ProductionTarget.forward_tensors`,
    :meth:`~fa4verify.targets.ProductionTarget.backward_tensors`), so every call is recorded in the
    target's kernel configurations."""
    name = "fa4"
    writes_into_buffers = True
    unsupported_msg = UNSUPPORTED_MSG

    def __init__(self) -> None:
        self.adapter = importlib.import_module("fa4verify.kernels.adapter")
        ok, reason = self.adapter.cuda_status()
        if not ok:
            raise EnvironmentError(f"no CUDA device: {reason}")
        import torch
        cc = torch.cuda.get_device_capability()
        self.arch = f"sm{cc[0]}{cc[1]}"
        # Note [adapter provenance cost]: adapter.versions() is called on every forward/backward
        # (importlib.metadata lookups, ~0.1 s each on a slow host), which would dominate a
        # 100-run loop. The versions cannot change inside a process, so this process answers
        # from a snapshot taken once; every call still records them in its CallConfig.
        if not getattr(self.adapter.versions, "_fa4v_cached", False):
            snap = self.adapter.versions()

            def _cached_versions(_snap=snap):
                return dict(_snap)
            _cached_versions._fa4v_cached = True  # type: ignore[attr-defined]
            _cached_versions.__doc__ = self.adapter.versions.__doc__
            self.adapter.versions = _cached_versions
        from fa4verify.targets import ProductionTarget
        self._target = ProductionTarget(adapter=self.adapter)
        self.where = self._target.where      # "measured on <GPU> (sm_XY)"

    @property
    def target(self):
        """The :class:`~fa4verify.targets.ProductionTarget` this backend runs. A backend made
        without ``__init__`` around a stand-in ``adapter`` (tests on the CPU) gets a stand-in target
        on first use."""
        t = self.__dict__.get("_target")
        if t is None or t._ad is not self.adapter:
            from fa4verify.targets import ProductionTarget
            t = self.__dict__["_target"] = ProductionTarget(adapter=self.adapter, device="cpu")
        return t

    def environment(self, device: str) -> dict[str, str]:
        import torch
        env = _common_env()
        idx = torch.device(device).index or 0
        env.update(gpu=torch.cuda.get_device_name(idx),
                   compute_capability=".".join(map(str, torch.cuda.get_device_capability(idx))),
                   driver=_driver_version(), cuda=str(torch.version.cuda),
                   fa4=_pkg_version("flash-attn-4"), dsl=_pkg_version("nvidia-cutlass-dsl"))
        try:
            v = self.adapter.versions()
            if isinstance(v, Mapping):
                for k2, val in v.items():
                    env.setdefault(f"adapter.{k2}", str(val))
        except Exception:  # noqa: BLE001 - versions() is informative only
            pass
        return env

    def forward(self, p: Problem):
        kw = _accepted(self.adapter.forward, dict(return_lse=True, **_features(p)))
        r = self.target.forward_tensors(p.q, p.k, p.v, **kw)
        return r.out, r.lse

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        kw = _accepted(self.adapter.backward, dict(deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                                                   **_features(p)))
        r = self.target.backward_tensors(p.q, p.k, p.v, out, p.dout, lse, **kw)
        return Grads(r.dq, r.dk, r.dv, getattr(r, "dsink", None), getattr(r, "config", None))

    def synchronize(self, device: str) -> None:
        import torch
        torch.cuda.synchronize(device)

    def classify(self, exc: BaseException) -> str:
        """Note [Blame] (fa4verify.blame): ``unsupported`` for FA4's own refusal (raised in FA4),
        a feature the release lacks (``UnsupportedByRelease``) or a refusal of the adapter;
        ``error`` for anything else -- above all an exception raised in fa4verify's own call,
        which measured nothing about FA4."""
        from fa4verify import blame
        own = tuple(getattr(self.adapter, n) for n in ("UnsupportedByRelease", "AdapterRefusal")
                    if isinstance(getattr(self.adapter, n, None), type))
        if isinstance(exc, (Unsupported,) + own):
            return "unsupported"
        return "unsupported" if blame.fa4_refusal(exc) else "error"


class TorchMathBackend(Backend):
    """fp32 PyTorch math attention (autograd), results rounded to the input dtype and copied into
    the given buffers. A reference that exercises the harness on the CPU; not FA4."""
    name = "torch-math"
    where = "CPU"
    writes_into_buffers = True

    def environment(self, device: str) -> dict[str, str]:
        env = _common_env()
        env.update(backend="torch-math", device=device)
        return env

    @staticmethod
    def _segments(p: Problem):
        c = p.cfg
        if not c.varlen:
            return [(b, None, None) for b in range(c.batch)]
        cq, ck = p.cu_seqlens_q.tolist(), p.cu_seqlens_k.tolist()
        return [(i, (cq[i], cq[i + 1]), (ck[i], ck[i + 1])) for i in range(len(cq) - 1)]

    def _attn(self, p: Problem, q, k, v, sink):
        """q (sq, h, d), k/v (sk, hkv, d) fp32 -> out (sq, h, dv), lse (h, sq)."""
        torch = _torch()
        c = p.cfg
        rep = c.nheads // c.nheads_kv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kk) * p.softmax_scale
        if c.softcap:
            s = torch.tanh(s / c.softcap) * c.softcap
        sq, sk = q.shape[0], k.shape[0]
        i = torch.arange(sq).unsqueeze(1) + (sk - sq)
        j = torch.arange(sk).unsqueeze(0)
        allow = torch.ones(sq, sk, dtype=torch.bool)
        left, right = (None, 0) if c.causal else c.window
        if right is not None:
            allow &= j <= i + right
        if left is not None:
            allow &= j >= i - left
        s = s.masked_fill(~allow, float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, sq, 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1)
        pr = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        if sink is not None:
            pr = pr[..., :-1]
        out = torch.einsum("hqk,khd->qhd", pr, vv)
        return out, lse

    def _run(self, p: Problem, grad: bool):
        torch = _torch()
        q = p.q.float().requires_grad_(grad)
        k = p.k.float().requires_grad_(grad)
        v = p.v.float().requires_grad_(grad)
        sink = p.sink.float().requires_grad_(grad) if p.sink is not None else None
        outs, lses = [], []
        for b, rq, rk in self._segments(p):
            if rq is None:
                o, l = self._attn(p, q[b], k[b], v[b], sink)
            else:
                o, l = self._attn(p, q[rq[0]:rq[1]], k[rk[0]:rk[1]], v[rk[0]:rk[1]], sink)
            outs.append(o)
            lses.append(l)
        if p.cfg.varlen:
            out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
        else:
            out, lse = torch.stack(outs, 0), torch.stack(lses, 0)
        return out, lse, (q, k, v, sink)

    def forward(self, p: Problem):
        with _torch().no_grad():
            out, lse, _ = self._run(p, False)
        return out.to(p.q.dtype), lse

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        torch = _torch()
        o, _, (q, k, v, sink) = self._run(p, True)
        ins = [t for t in (q, k, v, sink) if t is not None]
        gs = torch.autograd.grad(o, ins, p.dout.float())
        res = []
        for g, buf, ref in zip(gs[:3], (dq, dk, dv), (p.q, p.k, p.v)):
            g = g.to(ref.dtype)
            if buf is not None:
                buf.copy_(g)
                g = buf
            res.append(g)
        dsink = gs[3].to(p.sink.dtype) if sink is not None else None
        return Grads(*res, dsink=dsink)


class TwinBackend(Backend):
    """The CPU twin through the target layer (:class:`fa4verify.targets.TwinTarget`, with the
    backend's ``mutations``). It returns its own arrays (float32, as the twin stores them), so guard
    bands do not apply; its fixed accumulation order (``deterministic=True``) must be bitwise
    reproducible. Besides dQ/dK/dV it exposes the fp32 ``dq_accum`` (before the scale and the cast
    to bf16/fp16), which is digested too: an order change moves fp32 sums by an ULP or so, which
    the bf16 cast hides for all but ~1e-4 of the elements (CPU twin, sq=1024, 5 KV tiles: 0-4 of
    65536 dQ elements per run), while ``dq_accum`` shows it almost surely. Varlen is not modelled
    (``unsupported``): the twin target runs varlen sequence by sequence, not in FA4's order."""
    name = "twin"
    where = "CPU twin"
    writes_into_buffers = False
    unsupported_msg = "not modelled by the CPU twin for this configuration"

    def __init__(self, arch: str = "sm90", mutations: Iterable[str] = ()) -> None:
        from fa4verify.targets import TwinTarget
        self.arch = arch
        self.mutations = frozenset(mutations)
        self.target = TwinTarget(self.mutations)

    def environment(self, device: str) -> dict[str, str]:
        import numpy as np
        env = _common_env()
        env.update(backend="twin", arch=self.arch, numpy=np.__version__,
                   mutations=",".join(sorted(self.mutations)) or "none")
        return env

    def _problem(self, p: Problem):
        """The target layer's problem and arrays for ``p`` (float32 copies of the inputs' values)."""
        if p.cfg.varlen:
            raise Unsupported("varlen is not modelled by the CPU twin")
        from fa4verify import judge
        c = p.cfg
        q, k, v, dout, sink = (None if t is None else t.detach().cpu().float().numpy()
                               for t in (p.q, p.k, p.v, p.dout, p.sink))
        prob = judge.dense_problem(q, k, v, arch=self.arch, dtype=c.dtype, causal=c.causal,
                                   window_size=tuple(c.window), softmax_scale=p.softmax_scale,
                                   softcap=c.softcap, sink=sink is not None)
        return prob, judge.arrays_from(q, k, v, dout, learnable_sink=sink)

    def forward(self, p: Problem):
        import numpy as np
        f = self.target.forward(*self._problem(p))
        return f.out.astype(np.float32), f.lse.astype(np.float32)

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None) -> Grads:
        import numpy as np
        from fa4verify.targets import Fwd
        prob, a = self._problem(p)
        r = self.target.backward(prob, a, Fwd(np.asarray(out, np.float64), np.asarray(lse, np.float64)),
                                 deterministic=deterministic)
        extra = {}
        acc = (r.stages or {}).get("dq_accum")
        if acc is not None:
            extra["dq_accum"] = acc  # fp32, before x scale and the cast: shows order faults
        f32 = (lambda x: None if x is None else x.astype(np.float32))
        return Grads(f32(r.dq), f32(r.dk), f32(r.dv), f32(r.dsink), extra=extra)

    def classify(self, exc: BaseException) -> str:
        if isinstance(exc, (NotImplementedError, Unsupported)):
            return "unsupported"
        return "error"


def load_backend(spec: str, **kwargs) -> Backend:
    """``fa4`` | ``twin`` | ``torch-math`` | ``module:attr`` (a Backend subclass or factory).
    Raises ``EnvironmentError`` (no GPU, no adapter) or ``ImportError`` with the reason."""
    if spec == "fa4":
        try:
            return Fa4Backend()
        except ModuleNotFoundError as ex:
            if ex.name and ex.name.startswith("fa4verify.kernels.adapter"):
                raise EnvironmentError("fa4verify.kernels.adapter is not available "
                                       "(the production adapter has not landed)") from None
            raise EnvironmentError(f"FA4 adapter import failed: {ex}") from None
    if spec == "torch-math":
        return TorchMathBackend()
    if spec.startswith("twin"):
        # twin | twin:sm100 | twin:sm90+mutation1+mutation2
        rest = spec[4:].lstrip(":")
        parts = [x for x in rest.split("+") if x] if rest else []
        arch = parts[0] if parts and parts[0].startswith("sm") else "sm90"
        muts = [x for x in parts if not x.startswith("sm")]
        return TwinBackend(arch=arch, mutations=muts)
    if ":" in spec:
        mod, attr = spec.split(":", 1)
        obj = getattr(importlib.import_module(mod), attr)
        return obj(**kwargs) if callable(obj) else obj
    raise ValueError(f"unknown backend {spec!r} (fa4, twin[:smXX[+mutation]], torch-math, "
                     "module:attr)")
