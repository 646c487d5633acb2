"""Recorded evidence, scoped to what it describes.

A recording (golden vectors, MUFU statistics, head-dim sweeps, production figures, determinism
manifests) was measured on one GPU, with one FA4 release, for one arch and dtype. A check that
reads it applies only where the audit's configuration matches; otherwise it skips as
``not applicable: <why>`` (:meth:`Recording.require_applies`). Its figures are labelled
``recorded on <GPU name> (sm_XY)``.

What must match (``kind`` of the evidence decides which):

* **FA4 version** -- findings about FA4's kernels (``fa4=True``): the installed flash-attn-4 must
  be the recorded one. Without FA4 installed the check reports the recording and does not fail
  (skip: "not applicable: FA4 not installed").
* **arch** -- the recording's arch (from its compute capability) must be one the audit covers
  (``ctx.archs``), unless the evidence is about a device function FA4 runs on every arch
  (``any_arch=True``: the exp2 emulation probes).
* **dtype** -- the recorded dtype(s), when the evidence has one.
* **GPU family** -- an audit that runs on a GPU applies recordings of that GPU family only
  (H200 data says nothing about a B200).
* **deployment** -- where the audit has a deployment profile, recorded findings apply only to
  what the deployment ships (``deployment_hit``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional

from fa4verify.kernels import facts
from fa4verify.kernels.device import GPU

__all__ = ["Recording", "recording_from_versions"]


@dataclasses.dataclass(frozen=True)
class Recording:
    """Where and with what a stored file was measured."""

    name: str                      #: file name (for messages)
    gpu_name: Optional[str]
    capability: Optional[str]      #: "9.0"
    fa4: Optional[str]
    dsl: Optional[str] = None
    dtypes: tuple[str, ...] = ()   #: recorded input dtypes ("" = dtype-independent)

    @property
    def gpu(self) -> Optional[GPU]:
        if not self.gpu_name or not self.capability:
            return None
        major, minor = (int(x) for x in str(self.capability).split(".")[:2])
        return GPU(self.gpu_name, major, minor)

    @property
    def arch(self) -> Optional[str]:
        g = self.gpu
        return None if g is None else g.arch

    @property
    def where(self) -> str:
        """``recorded on NVIDIA H200 (sm_90)``."""
        g = self.gpu
        if g is None:
            raise ValueError(f"{self.name}: the recording names no GPU and compute capability")
        return f"recorded on {g.label}"

    def why_not_applicable(self, ctx: Any, *, fa4: bool = True, any_arch: bool = False,
                           any_gpu: bool = False, params_version: Optional[str] = None) -> Optional[str]:
        """The reason this recording does not apply to the audit ``ctx``, or None.

        ``params_version``: for evidence about FA4's device functions checked against the twin,
        the FA4 version the twin's knobs come from (installed or pinned) must be the recorded
        one (``fa4=False`` then). ``any_gpu``: the check compares a CPU model with the stored
        bits, which is true on any machine (the label still names the recording's GPU)."""
        g = self.gpu
        if g is None:
            return f"{self.name} names no GPU (cannot label it)"
        if params_version is not None and params_version != self.fa4:
            return (f"{self.name} was recorded with flash-attn-4 {self.fa4}; the twin's knobs come from "
                    f"{params_version}")
        if fa4:
            inst = facts.dist_version("flash-attn-4")
            if inst is None:
                return (f"FA4 not installed; {self.name} was recorded with flash-attn-4 {self.fa4} on "
                        f"{g.label}")
            if inst != self.fa4:
                return (f"{self.name} was recorded with flash-attn-4 {self.fa4}; {inst} is installed "
                        f"(re-record on a GPU, or run the live check)")
        if not any_arch and g.arch not in tuple(getattr(ctx, "archs", ()) or ()):
            return (f"{self.name} describes {g.arch} ({g.label}); this audit covers "
                    f"{', '.join(getattr(ctx, 'archs', ()) or ()) or 'no arch'}")
        if self.dtypes and getattr(ctx, "dtype", None) not in self.dtypes:
            return f"{self.name} was recorded for {'/'.join(self.dtypes)}; this audit is {ctx.dtype}"
        local = None if any_gpu else getattr(ctx, "gpu", None)
        if local is not None and local.family != g.family:
            return (f"{self.name} was recorded on {g.label}; this audit runs on {local.label} "
                    f"(run the live check)")
        return None

    def require_applies(self, ctx: Any, **kw: Any) -> str:
        """Skip the check as "not applicable: <why>" unless the recording applies; returns the
        ``where`` label."""
        why = self.why_not_applicable(ctx, **kw)
        if why:
            ctx.skip(f"not applicable: {why}")
        return self.where


def recording_from_versions(name: str, versions: Mapping[str, Any] | None,
                            dtypes: Iterable[str] = ()) -> Recording:
    """A :class:`Recording` from the ``versions`` dict every recorder writes (adapter.versions())."""
    v = dict(versions or {})
    return Recording(name=name, gpu_name=v.get("gpu"), capability=v.get("compute_capability"),
                     fa4=v.get("fa4"), dsl=v.get("dsl"), dtypes=tuple(dtypes))
