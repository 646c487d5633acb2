"""Deployment profiles: what a team ships, as reviewed TOML, and the cases every check draws from it.

``fa4verify audit --deployment FILE.toml`` (and ``pytest --fa4verify --fa4verify-deployment
FILE.toml``) narrows the audit to the shapes and features a model runs: every live check draws its
cases from the profile, the fuzz strategies draw only from it, and recorded findings apply only
where they intersect it (a finding at head dim 40 says nothing to a hd-128 deployment).

Format (every key optional except ``name``; lists mean "any of")::

    name = "llama3-8b-like"
    description = "Llama-3-8B-like attention: hd 128, 32 q / 8 kv heads, causal, bf16, up to 8k"
    dtypes = ["bf16"]
    head_dims = [128]            # head_dim == head_dim_v, or [[192, 128]] pairs
    nheads = 32                  # query heads
    nheads_kv = 8                # GQA kv heads
    masks = ["causal"]           # any of "none", "causal", "window"
    window_sizes = [[4096, 0]]   # (left, right) for mask "window"
    softcap = 0.0                # 0 = off
    softmax_scales = [0.0625]    # explicit softmax_scale values (absent: FA4's default 1/sqrt(hd) only)
    sinks = false                # learnable sinks
    sink_dtype = "bf16"          # the sinks' dtype: "fp32" (default), "bf16" or "fp16"
    varlen = false
    seqlen_q = [1, 8192]         # inclusive range (min 0: empty sequences of a varlen batch)
    seqlen_k = [1, 8192]
    distributions = ["normal", "outliers"]   # value recipes the fuzz strategies draw (default: all;
                                             # fa4verify.problem.values.DISTRIBUTIONS)
    features = ["paged_kv", "seqused_k"]     # FA4 call forms the fuzz draws (CALL_FEATURES: paged_kv,
                                             # seqused_k, seqused_q, block_sparse, mask_mod_fn, pack_gqa,
                                             # split_kv)
    page_sizes = [16, 128]       # paged_kv page sizes (default: 16 and the head dim's tile_n)
    nan_pages = false            # the KV pool may hold NaN in pages no key uses (stale pages)

Profiles shipped with fa4verify are in ``fa4verify/data/deployments/`` (``--deployment
llama3-8b`` names one of them).
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional
from fa4verify.errors import DeploymentError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from fa4verify.kernels import facts

__all__ = ["Deployment", "load", "shipped", "SHIPPED_DIR", "MASKS"]

SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "deployments"
MASKS = ("none", "causal", "window")
_KEYS = {"name", "description", "dtypes", "head_dims", "nheads", "nheads_kv", "masks", "window_sizes",
         "softcap", "sinks", "varlen", "seqlen_q", "seqlen_k", "archs", "distributions", "features",
         "page_sizes", "nan_pages", "softmax_scales", "sink_dtype"}
_MAX_BYTES = 1 << 20
#: upper bounds of the integer keys (a profile is input: 2**63 would reach numpy and FA4 as an
#: overflow or a huge allocation instead of a one-line error); far above any real model
_MAX = {"head_dims": 1024, "nheads": 1 << 16, "nheads_kv": 1 << 16, "page_sizes": 1 << 20,
        "seqlen_q": 1 << 24, "seqlen_k": 1 << 24, "window_sizes": 1 << 24}
_MAX_SOFTCAP = 1e6


def _ints(v: Any, key: str, where: str) -> tuple[int, ...]:
    vals = v if isinstance(v, list) else [v]
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise DeploymentError(f"{where}: {key} must be positive integers, got {x!r}")
        if x > _MAX[key]:
            raise DeploymentError(f"{where}: {key} {x} is larger than {_MAX[key]}")
        out.append(int(x))
    if not out:
        raise DeploymentError(f"{where}: {key} is empty")
    return tuple(out)


def _choices(v: Any, key: str, where: str, allowed: Iterable[str]) -> tuple[str, ...]:
    """A string or list of strings, each one of ``allowed``, non-empty."""
    allowed = tuple(allowed)
    vals = tuple(v) if isinstance(v, list) else (v,)
    bad = [x for x in vals if x not in allowed]
    if bad or not vals:
        raise DeploymentError(f"{where}: {key} {bad or vals!r}: choose from {', '.join(allowed)}")
    return vals


def _range(v: Any, key: str, where: str) -> tuple[int, int]:
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise DeploymentError(f"{where}: {key} must be [min, max] integers, got {v!r}")
    lo, hi = int(v[0]), int(v[1])
    if lo < 0 or hi < max(lo, 1) or hi > _MAX[key]:
        raise DeploymentError(f"{where}: {key} = [{lo}, {hi}] needs 0 <= min <= max <= {_MAX[key]}, max >= 1 "
                              f"(min 0: empty sequences in a varlen batch)")
    return lo, hi


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A validated deployment profile (see the module docstring)."""

    name: str
    description: str = ""
    dtypes: tuple[str, ...] = ("bf16",)
    head_dims: tuple[tuple[int, int], ...] = ((128, 128),)
    nheads: tuple[int, ...] = (8,)
    nheads_kv: tuple[int, ...] = (8,)
    masks: tuple[str, ...] = ("none", "causal")
    window_sizes: tuple[tuple[int, int], ...] = ()
    softcap: tuple[float, ...] = (0.0,)
    #: explicit softmax_scale values; () = FA4's default (1/sqrt(head_dim)) only
    softmax_scales: tuple[float, ...] = ()
    sinks: bool = False
    sink_dtype: str = "fp32"
    varlen: bool = False
    seqlen_q: tuple[int, int] = (1, 8192)
    seqlen_k: tuple[int, int] = (1, 8192)
    archs: tuple[str, ...] = facts.ARCHS
    distributions: tuple[str, ...] = ()     #: () = every value recipe
    #: FA4 call forms the fuzz draws (``fa4verify.problem.calls.CALL_FEATURES``)
    features: tuple[str, ...] = ()
    page_sizes: tuple[int, ...] = ()        #: () = 16 and the head dim's tile_n
    nan_pages: bool = False
    source: str = ""

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "<deployment>") -> "Deployment":
        unknown = set(d) - _KEYS
        if unknown:
            raise DeploymentError(f"{where}: unknown key(s) {sorted(unknown)} (known: {sorted(_KEYS)})")
        if not isinstance(d.get("name"), str) or not d["name"].strip():
            raise DeploymentError(f"{where}: name must be a non-empty string")
        if not isinstance(d.get("description", ""), str):
            raise DeploymentError(f"{where}: description must be a string")
        kw: dict[str, Any] = {"name": d["name"].strip(), "source": where,
                              "description": d.get("description", "")}
        from fa4verify.problem import CALL_FEATURES, MOD_FEATURE, DISTRIBUTIONS
        for key, allowed in (("dtypes", facts.DTYPES), ("archs", facts.ARCHS), ("masks", MASKS),
                             ("distributions", DISTRIBUTIONS), ("features", CALL_FEATURES + (MOD_FEATURE,))):
            if key in d:
                kw[key] = _choices(d[key], key, where, allowed)
        if "head_dims" in d:
            if isinstance(d["head_dims"], list) and not d["head_dims"]:
                raise DeploymentError(f"{where}: head_dims is empty")
            hds = []
            for x in d["head_dims"] if isinstance(d["head_dims"], list) else [d["head_dims"]]:
                if isinstance(x, list):
                    if len(x) != 2:
                        raise DeploymentError(f"{where}: head_dims pair {x!r} must be [head_dim, head_dim_v]")
                    a, b = _ints(x, "head_dims", where)
                else:
                    a = b = _ints(x, "head_dims", where)[0]
                hds.append((a, b))
            if not hds:
                raise DeploymentError(f"{where}: head_dims is empty")
            kw["head_dims"] = tuple(hds)
        for key in ("nheads", "nheads_kv"):
            if key in d:
                kw[key] = _ints(d[key], key, where)
        if "window_sizes" in d:
            if not isinstance(d["window_sizes"], list):
                raise DeploymentError(f"{where}: window_sizes must be a list of [left, right], got "
                                      f"{d['window_sizes']!r}")
            ws = []
            for w in d["window_sizes"]:
                if not (isinstance(w, list) and len(w) == 2 and all(
                        isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX["window_sizes"]
                        for x in w)):
                    raise DeploymentError(f"{where}: window_sizes entry {w!r} must be [left, right] "
                                          f"in 0..{_MAX['window_sizes']}")
                ws.append((int(w[0]), int(w[1])))
            kw["window_sizes"] = tuple(ws)
        if "window" in kw.get("masks", ()) and not kw.get("window_sizes"):
            raise DeploymentError(f"{where}: mask 'window' needs window_sizes")
        if "softcap" in d:
            sc = d["softcap"] if isinstance(d["softcap"], list) else [d["softcap"]]
            vals = []
            if not sc:
                raise DeploymentError(f"{where}: softcap is empty (0 = off)")
            for x in sc:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 \
                        or x > _MAX_SOFTCAP:
                    raise DeploymentError(f"{where}: softcap {x!r} must be finite and in [0, {_MAX_SOFTCAP:g}]")
                vals.append(float(x))
            kw["softcap"] = tuple(vals)
        if "softmax_scales" in d:
            ss = d["softmax_scales"] if isinstance(d["softmax_scales"], list) else [d["softmax_scales"]]
            if not ss:
                raise DeploymentError(f"{where}: softmax_scales is empty (leave it out for FA4's default)")
            for x in ss:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not 0 < x <= 1e3:
                    raise DeploymentError(f"{where}: softmax_scales {x!r} must be finite and in (0, 1000]")
            kw["softmax_scales"] = tuple(float(x) for x in ss)
        if "page_sizes" in d:
            kw["page_sizes"] = _ints(d["page_sizes"], "page_sizes", where)
            if "paged_kv" not in kw.get("features", ()):
                raise DeploymentError(f"{where}: page_sizes needs \"paged_kv\" in features")
        for key in ("sinks", "varlen", "nan_pages"):
            if key in d:
                if not isinstance(d[key], bool):
                    raise DeploymentError(f"{where}: {key} must be true or false")
                kw[key] = d[key]
        if "sink_dtype" in d:
            from fa4verify.problem import SINK_DTYPES
            if d["sink_dtype"] not in SINK_DTYPES:
                raise DeploymentError(f"{where}: sink_dtype {d['sink_dtype']!r}: choose from {', '.join(SINK_DTYPES)}")
            if not kw.get("sinks"):
                raise DeploymentError(f"{where}: sink_dtype needs sinks = true")
            kw["sink_dtype"] = d["sink_dtype"]
        if kw.get("nan_pages") and "paged_kv" not in kw.get("features", ()):
            raise DeploymentError(f"{where}: nan_pages needs \"paged_kv\" in features")
        for key in ("seqlen_q", "seqlen_k"):
            if key in d:
                kw[key] = _range(d[key], key, where)
                kv_forms = {"paged_kv", "seqused_k", "seqused_q"} & set(kw.get("features", ()))
                if kw[key][0] == 0 and not (kw.get("varlen") or kv_forms):
                    raise DeploymentError(f"{where}: {key} minimum 0 (empty sequences) needs varlen = true or a "
                                          f"KV call form (paged_kv, seqused_k, seqused_q) in features")
        for key in ("nheads", "nheads_kv"):
            kw.setdefault(key, cls.__dataclass_fields__[key].default)
        for h in kw["nheads"]:
            if not any(h % hk == 0 for hk in kw["nheads_kv"]):
                raise DeploymentError(f"{where}: nheads {h} is not a multiple of any nheads_kv {kw['nheads_kv']}")
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        out = {k: (list(map(list, v)) if k in ("head_dims", "window_sizes") else (list(v) if isinstance(v, tuple) else v))
               for k, v in d.items()}
        for k in ("distributions", "features", "page_sizes", "softmax_scales"):
            if not out[k]:
                out.pop(k)
        if out["sink_dtype"] == "fp32":
            out.pop("sink_dtype")
        if not out["nan_pages"]:
            out.pop("nan_pages")
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Deployment":
        src = d.get("source", "<deployment>")
        dd = {k: v for k, v in d.items() if k != "source"}
        return cls.from_mapping(dd, src)

    # ------------------------------------------------------------------ questions
    @property
    def head_dim_values(self) -> tuple[int, ...]:
        return tuple(sorted({h for h, _ in self.head_dims}))

    def ships_head_dim(self, head_dim: int, head_dim_v: Optional[int] = None) -> bool:
        hv = head_dim if head_dim_v is None else head_dim_v
        return (int(head_dim), int(hv)) in self.head_dims

    def ships_mask(self, causal: bool, local: bool = False) -> bool:
        kind = "window" if local else ("causal" if causal else "none")
        return kind in self.masks

    def ships_seqlen(self, seqlen_q: int, seqlen_k: Optional[int] = None) -> bool:
        sk = seqlen_q if seqlen_k is None else seqlen_k
        return (self.seqlen_q[0] <= seqlen_q <= self.seqlen_q[1]
                and self.seqlen_k[0] <= sk <= self.seqlen_k[1])

    def covers(self, *, head_dim: int, head_dim_v: Optional[int] = None, causal: bool = False,
               local: bool = False, seqlen_q: Optional[int] = None, seqlen_k: Optional[int] = None,
               dtype: Optional[str] = None) -> bool:
        """Whether a recorded case (one row of a sweep) is something this deployment runs."""
        if not self.ships_head_dim(head_dim, head_dim_v):
            return False
        if not self.ships_mask(causal, local):
            return False
        if seqlen_q is not None and not self.ships_seqlen(seqlen_q, seqlen_k):
            return False
        if dtype is not None and dtype not in self.dtypes:
            return False
        return True

    def live_cases(self, *, arch: str, dtype: str, seqlens: Iterable[int] = (512,),
                   limit: int = 4) -> list[dict[str, Any]]:
        """Cases for the live production checks: (head_dim, head_dim_v, nheads, nheads_kv, causal,
        window_size, softcap, sink, sink_dtype, softmax_scale, seqlen), each supported by FA4 on ``arch``, clipped to the
        profile's seqlen range; at most ``limit`` (the first of each head-dim x mask)."""
        out: list[dict[str, Any]] = []
        for hd, hdv in self.head_dims:
            if not facts.head_dims_supported(arch, hd, hdv, dtype):
                continue
            for m in self.masks:
                windows = self.window_sizes if m == "window" else ((None, None),)
                for ws in windows[:1]:
                    for s in seqlens:
                        s = max(self.seqlen_q[0], min(int(s), self.seqlen_q[1]))
                        out.append({"head_dim": hd, "head_dim_v": hdv, "nheads": self.nheads[0],
                                    "nheads_kv": self.nheads_kv[0], "causal": m == "causal",
                                    "window_size": tuple(ws), "softcap": self.softcap[0], "sink": self.sinks,
                                    "sink_dtype": self.sink_dtype if self.sinks else "fp32",
                                    "softmax_scale": self.softmax_scales[0] if self.softmax_scales else None,
                                    "seqlen": s})
        return out[:limit] if limit else out

    def confine(self, space: Any) -> Any:
        """The coverage plan's :class:`~fa4verify.coverage.space.FeatureSpace` confined to this
        deployment: its head dims, masks and windows, head counts, sequence lengths (tile edges
        inside the range, else its ends), softcap values, sinks, call forms (``features``, page
        sizes), value recipes, arch and dtype. A dimension left with no value makes the space
        empty: the plan has no row ("nothing ran")."""
        from fa4verify.coverage.space import PLAN_DISTRIBUTIONS, is_paged
        sp = space
        if space.arch not in self.archs or space.dtype not in self.dtypes:
            why = (f"arch {space.arch} not in {list(self.archs)}" if space.arch not in self.archs
                   else f"dtype {space.dtype} not in {list(self.dtypes)}")
            return sp.restrict("form", (), f"deployment {self.name}: {why}")
        hd = {(f"{a}" if a == b else f"{a}x{b}"): (a, b) for a, b in self.head_dims
              if facts.head_dims_supported(space.arch, a, b, space.dtype)}
        sp = dataclasses.replace(sp, hd=hd, values=dict(sp.values, hd=tuple(hd)),
                                 notes=dict(sp.notes, hd=f"deployment {self.name}: head dims "
                                            f"{[list(p) for p in self.head_dims]} ({len(hd)} supported)"))
        masks: list[str] = []
        windows: dict[str, tuple] = {}
        for m in self.masks:
            if m in ("none", "causal"):
                masks.append(m)
            else:
                for wl, wr in self.window_sizes:
                    name = f"win:{wl},{wr}"
                    windows[name] = (wl, wr)
                    masks.append(name)
        sp = dataclasses.replace(sp, windows=windows, values=dict(sp.values, mask=tuple(masks)),
                                 notes=dict(sp.notes, mask=f"deployment {self.name}: masks {list(self.masks)}"))
        heads = {f"h:{h}/{hk}": (h, hk) for h in self.nheads for hk in self.nheads_kv if h % hk == 0}
        if "pack_gqa" in self.features:       # each GQA head count also with pack_gqa=False
            heads.update({f"{n}_unpacked": hh for n, hh in list(heads.items()) if hh[0] > hh[1]})
        sp = dataclasses.replace(sp, heads=heads, values=dict(sp.values, gqa=tuple(heads)))
        (ql, qh), (kl, kh) = self.seqlen_q, self.seqlen_k
        lengths: dict[str, tuple[int, int]] = {}
        for a in sorted({max(ql, 1), min(ql + 1, qh), min(max(ql, 128), qh), min(max(ql, 129), qh)}):
            b = max(kl, min(a, kh))
            lengths[f"len:{a},{b}"] = (a, b)
        if qh != kh or ql != kl:
            k_long = kh if kh <= 4 * max(ql, 1) else max(kl, 1, min(kh, 2 * max(ql, 64)))
            lengths[f"len:{max(ql, 1)},{k_long}"] = (max(ql, 1), k_long)
        if ql == 0 or kl == 0:
            # empty sequences (a minimum of 0): the space's "zero" value (varlen call forms only);
            # 0 marks the side that may be empty (coverage.cases.problem_for)
            lengths["zero"] = (0 if ql == 0 else ql, 0 if kl == 0 else kl)
        sp = dataclasses.replace(sp, lengths=lengths, values=dict(sp.values, seqlen=tuple(lengths)),
                                 notes=dict(sp.notes, seqlen=f"deployment {self.name}: seqlen_q {list(self.seqlen_q)}, "
                                            f"seqlen_k {list(self.seqlen_k)}"))
        caps = {("off" if c == 0 else f"on:{c:g}"): float(c) for c in self.softcap}
        sp = dataclasses.replace(sp, softcaps=caps, values=dict(sp.values, softcap=tuple(caps)))
        # the sink's value is its dtype (the space's own values: off / fp32 / bf16; a profile may ship fp16)
        sp = dataclasses.replace(sp, values=dict(sp.values, sink=(self.sink_dtype,) if self.sinks else ("off",)),
                                 notes=dict(sp.notes, sink=f"deployment {self.name}: sinks={self.sinks}"
                                            + (f" ({self.sink_dtype})" if self.sinks else "")))
        scales = {f"scale:{x:g}": x for x in self.softmax_scales} or {"default": None}
        sp = dataclasses.replace(sp, scales={k: v for k, v in scales.items() if v is not None},
                                 values=dict(sp.values, scale=tuple(scales)),
                                 notes=dict(sp.notes, scale=f"deployment {self.name}: softmax_scale "
                                            + ("/".join(f"{x:g}" for x in self.softmax_scales) or "FA4's default")))
        forms = ["dense"] + (["varlen"] if self.varlen else [])
        pages: dict[str, int] = {}
        if "seqused_k" in self.features:
            forms.append("seqused_k")
        if "seqused_q" in self.features:
            forms.append("seqused_q")
        if "paged_kv" in self.features:
            if self.page_sizes:
                for ps in self.page_sizes:
                    pages[f"paged:{ps}"] = int(ps)
                    forms.append(f"paged:{ps}")
            else:
                forms += ["paged_small", "paged_tile"]
        if "block_sparse" in self.features:
            forms.append("block_sparse")
        if "block_sparse" in self.features and "mod_pairs" in self.features:
            forms.append("block_sparse_mod")
        if "block_sparse" in self.features and self.varlen:
            forms.append("block_sparse_varlen")
        if "mask_mod_fn" in self.features or "mod_pairs" in self.features:
            forms.append("mask_mod")
        if "mod_pairs" in self.features:
            forms.append("score_mod")
        if "split_kv" in self.features:
            forms.append("split_kv")
        keep = [f for f in forms if f in space.values["form"] or is_paged(f)]
        sp = dataclasses.replace(sp, pages=pages, values=dict(sp.values, form=tuple(keep)),
                                 notes=dict(sp.notes, form=f"deployment {self.name}: call forms {keep}"))
        dists = [d for d in (self.distributions or PLAN_DISTRIBUTIONS) if d in PLAN_DISTRIBUTIONS]
        if "edges" not in dists and dists:
            dists.append("edges")     # the mask-edge values are no distribution of activations: always judged
        sp = sp.restrict("values", dists, f"deployment {self.name}: value recipes {dists}")
        return sp

    def nothing_supported(self, arch: str, dtype: str) -> Optional[str]:
        """Why this deployment's space (:meth:`confine`) holds nothing the installed FA4 supports
        on ``arch`` / ``dtype`` (an arch or dtype it does not ship, no head dim FA4 runs there, no
        combination of its values FA4 accepts), or None when it holds something. An audit does
        not audit such an arch (Note [An empty deployment runs nothing], ``fa4verify._options``)."""
        from fa4verify.coverage.planner import no_valid_row
        from fa4verify.coverage.space import space_for
        pairs = {} if {"mod_pairs", "mask_mod_fn"} & set(self.features) else \
            {"score_pairs": (), "mask_pairs": (), "mask_pairs_bwd": ()}    # no pair form: skip the registries
        return no_valid_row(space_for(arch, dtype, deployment=self, **pairs))

    def strategy_kwargs(self, *, arch: Optional[str] = None, dtype: Optional[str] = None) -> dict[str, Any]:
        """Arguments for :func:`fa4verify._strategies.problem.attention_problems` that keep the
        drawn problems inside this deployment (Note [Confined draws]): ``features`` (what may
        appear: the masks, softcap, sinks, varlen and the call forms it ships), ``limits`` (the
        values each dimension is drawn from: head dims and pairs, head counts, sequence ranges,
        masks and windows, softcap values, sinks, page sizes) and ``distributions``. With
        ``arch``, only the head dims FA4 supports there (for ``dtype``, default the first shipped)."""
        feats = set()
        if "causal" in self.masks:
            feats.add("causal")
        if "window" in self.masks:
            feats.add("local")
        if any(self.softcap):
            feats.add("softcap")
        if self.sinks:
            feats.add("sink")
        if self.varlen:
            feats.add("varlen")
        if any(h != hk for h in self.nheads for hk in self.nheads_kv):
            feats.add("gqa")
        feats |= set(self.features)            # FA4 call forms (paged KV, seqused_k, ...)
        if "paged_kv" in self.features and not self.varlen:
            feats.add("varlen")                 # paged KV is a varlen call (packed or batched q)
        hds = [(h, hv) for h, hv in self.head_dims
               if arch is None or facts.head_dims_supported(arch, h, hv, dtype or self.dtypes[0])]
        limits: dict[str, Any] = {
            "head_dim_choices": tuple(h if h == hv else (h, hv) for h, hv in hds),
            "head_count_choices": tuple((h, hk) for h in self.nheads for hk in self.nheads_kv if h % hk == 0),
            "seqlen_q_range": tuple(self.seqlen_q), "seqlen_k_range": tuple(self.seqlen_k),
            "mask_choices": tuple(self.masks), "window_choices": tuple(self.window_sizes),
            "softcap_choices": tuple(self.softcap), "sinks": bool(self.sinks),
            "scale_choices": tuple(self.softmax_scales) or (None,), "sink_dtype": self.sink_dtype}
        if self.page_sizes:
            limits["page_sizes"] = tuple(self.page_sizes)
        if self.nan_pages:
            limits["hostile_nan"] = True
        return {"features": tuple(sorted(feats)), "limits": limits,
                "distributions": tuple(self.distributions) or None}

    def describe(self) -> str:
        return (f"{self.name}: hd {', '.join(f'{a}' if a == b else f'{a}/{b}' for a, b in self.head_dims)}; "
                f"heads {'/'.join(map(str, self.nheads))} q, {'/'.join(map(str, self.nheads_kv))} kv; "
                f"masks {', '.join(self.masks)}; {', '.join(self.dtypes)}; seqlen "
                f"{self.seqlen_q[0]}..{self.seqlen_q[1]}"
                + (f"; sinks ({self.sink_dtype})" if self.sinks else "") + ("; varlen" if self.varlen else "")
                + ("; softcap " + "/".join(f"{x:g}" for x in self.softcap) if any(self.softcap) else "")
                + ("; softmax_scale " + "/".join(f"{x:g}" for x in self.softmax_scales) if self.softmax_scales else "")
                + ("; calls " + ", ".join(self.features) if self.features else "")
                + ("; pages " + "/".join(map(str, self.page_sizes)) if self.page_sizes else "")
                + ("; NaN page pool" if self.nan_pages else ""))


def shipped() -> dict[str, Path]:
    """Name -> path of the profiles shipped with fa4verify."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.toml"))}


def load(name_or_path: str | os.PathLike) -> Deployment:
    """A shipped profile by name, or a TOML file. Raises :class:`DeploymentError` (one line)."""
    s = str(name_or_path)
    ships = shipped()
    if s in ships:
        path = ships[s]
    else:
        path = Path(s)
        if not path.exists():
            raise DeploymentError(f"--deployment {s!r}: no such file, and not a shipped profile "
                                  f"({', '.join(ships) or 'none shipped'})")
    if not path.is_file():
        raise DeploymentError(f"--deployment {s!r}: not a regular file")
    if path.stat().st_size > _MAX_BYTES:
        raise DeploymentError(f"--deployment {s!r}: larger than {_MAX_BYTES} bytes")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise DeploymentError(f"{path}: not valid TOML ({e})") from None
    except RecursionError:
        raise DeploymentError(f"{path}: not a deployment profile (nested too deeply)") from None
    return Deployment.from_mapping(data, str(path))
