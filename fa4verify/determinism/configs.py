"""The configuration matrix of the determinism check: :class:`DeterminismConfig`, its validation,
the named matrices and the selection syntax of ``--configs``."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

Dtype = Literal["bf16", "fp16"]
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class DeterminismConfig:
    """One backward problem. Layout as FA4: (batch, seqlen, nheads, head_dim); with ``varlen``
    the batch is packed to (total, nheads, head_dim) with ``seqlens_q``/``seqlens_k`` per sequence.

    ``window`` is FA4's ``window_size=(left, right)`` (None = unbounded); ``causal`` and a window
    are mutually exclusive here. ``upstream_xfail`` names the arches on which upstream's tests mark
    the configuration xfail for deterministic backward, with the reason (a non-reproducible result
    there is reported as ``xfail``, not a failure).
    """
    name: str
    batch: int = 2
    seqlen_q: int = 512
    seqlen_k: int = 512
    nheads: int = 8
    nheads_kv: int = 8
    head_dim: int = 128
    head_dim_v: int | None = None
    causal: bool = False
    window: tuple[int | None, int | None] = (None, None)
    softcap: float = 0.0
    sink: bool = False
    varlen: bool = False
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    dtype: Dtype = "bf16"
    seed: int = 0
    upstream_xfail: tuple[tuple[str, str], ...] = ()

    @property
    def hdv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def local(self) -> bool:
        return self.window != (None, None)

    @property
    def attention(self) -> str:
        if self.nheads_kv == self.nheads:
            return "mha"
        return "mqa" if self.nheads_kv == 1 else "gqa"

    @property
    def mask(self) -> str:
        return "causal" if self.causal else ("local" if self.local else "full")

    def shape_key(self) -> str:
        if self.varlen:
            sq = ",".join(map(str, self.seqlens_q))
            sk = ",".join(map(str, self.seqlens_k))
            s = f"varlen[q={sq};k={sk}]"
        else:
            s = f"b{self.batch}.sq{self.seqlen_q}.sk{self.seqlen_k}"
        return f"{s}.h{self.nheads}.hkv{self.nheads_kv}.d{self.head_dim}.dv{self.hdv}"

    def key(self) -> str:
        """Manifest key: configuration name, features, shape, dtype and seed."""
        feats = [self.mask]
        if self.local:
            feats.append(f"w{self.window[0]},{self.window[1]}")
        if self.softcap:
            feats.append(f"softcap{self.softcap:g}")
        if self.sink:
            feats.append("sink")
        return f"{self.name}|{'+'.join(feats)}|{self.shape_key()}|{self.dtype}|seed{self.seed}"

    def xfail_reason(self, arch: str | None) -> str | None:
        for a, why in self.upstream_xfail:
            if arch is not None and a == arch:
                return why
        return None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        d["seqlens_q"] = list(self.seqlens_q)
        d["seqlens_k"] = list(self.seqlens_k)
        d["upstream_xfail"] = [list(x) for x in self.upstream_xfail]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DeterminismConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown configuration field(s): {sorted(unknown)}")
        d = dict(d)
        if "window" in d:
            d["window"] = tuple(d["window"])
        for k in ("seqlens_q", "seqlens_k"):
            if k in d:
                d[k] = tuple(int(x) for x in d[k])
        if "upstream_xfail" in d:
            d["upstream_xfail"] = tuple(tuple(x) for x in d["upstream_xfail"])
        return cls(**d)


def validate_config(cfg: DeterminismConfig) -> list[str]:
    """Problems with a configuration, as messages naming the field and value (empty if valid).

    These are the harness's own rules (shapes that make sense, FA4's generic head-dim range of
    8..256 in multiples of 8 for 16-bit inputs); *whether FA4 accepts the configuration on a given
    arch* is decided by FA4 itself at run time and reported as ``unsupported``.
    """
    e: list[str] = []
    if not cfg.name or any(c in cfg.name for c in "|\n "):
        e.append(f"name {cfg.name!r} must be non-empty without '|', spaces or newlines")
    if cfg.dtype not in _TORCH_DTYPES:
        e.append(f"dtype {cfg.dtype!r} must be one of {sorted(_TORCH_DTYPES)}")
    for f in ("nheads", "nheads_kv"):
        if getattr(cfg, f) < 1:
            e.append(f"{f}={getattr(cfg, f)} must be >= 1")
    if cfg.nheads >= 1 and cfg.nheads_kv >= 1 and cfg.nheads % cfg.nheads_kv:
        e.append(f"nheads={cfg.nheads} must be a multiple of nheads_kv={cfg.nheads_kv}")
    for f, v in (("head_dim", cfg.head_dim), ("head_dim_v", cfg.hdv)):
        if not (8 <= v <= 256) or v % 8:
            e.append(f"{f}={v} must be in 8..256 and a multiple of 8")
    if cfg.causal and cfg.local:
        e.append(f"causal=True and window={cfg.window} are exclusive (use one)")
    for w in cfg.window:
        if w is not None and (not isinstance(w, int) or w < 0):
            e.append(f"window={cfg.window}: each side must be None or an int >= 0")
    if not (cfg.softcap >= 0.0) or math.isinf(cfg.softcap):
        e.append(f"softcap={cfg.softcap} must be finite and >= 0")
    if cfg.seed < 0:
        e.append(f"seed={cfg.seed} must be >= 0")
    if cfg.varlen:
        if not cfg.seqlens_q or len(cfg.seqlens_q) != len(cfg.seqlens_k):
            e.append(f"varlen needs seqlens_q and seqlens_k of equal, non-zero length; got "
                     f"{len(cfg.seqlens_q)} and {len(cfg.seqlens_k)}")
        if any(s < 0 for s in cfg.seqlens_q + cfg.seqlens_k):
            e.append("varlen sequence lengths must be >= 0")
        if cfg.seqlens_q and sum(cfg.seqlens_q) == 0:
            e.append("varlen seqlens_q must not all be 0")
    else:
        if cfg.seqlens_q or cfg.seqlens_k:
            e.append("seqlens_q/seqlens_k are only for varlen=True")
        for f in ("batch", "seqlen_q", "seqlen_k"):
            if getattr(cfg, f) < 1:
                e.append(f"{f}={getattr(cfg, f)} must be >= 1")
    for a, why in cfg.upstream_xfail:
        if a not in ("sm90", "sm100", "sm103", "sm110", "sm120") or not why:
            e.append(f"upstream_xfail entry {(a, why)!r}: arch must be smXX and a reason given")
    return e


_XF_SM90_192 = ("sm90", "upstream tests/cute/test_flash_attn_race_condition.py: "
                "'headdim 192 not supported on sm90' (xfail) -- upstream tests/cute/test_flash_attn.py")
_XF_SM90_256 = ("sm90", "upstream tests/cute/test_flash_attn.py marks SM90 hd>192 backward xfail "
                "-- flash_attn/cute/flash_bwd_preprocess.py / flash_bwd_postprocess.py; FA4 4.0.0b36 accepts it (tile 64x48, interface.py "
                "_tile_size_bwd_sm90)")

#: Named matrices. ``h200`` is sized to run 100 x 3 processes inside a few minutes on one H200;
#: shapes sit on and off the SM90 backward tiles (hd<=64: 128x128; hd128: 80x128 non-causal,
#: 64x128 causal/local; hd192: 64x96; hd256: 64x48 -- interface.py ``_tile_size_bwd_sm90``).
MATRICES: dict[str, tuple[DeterminismConfig, ...]] = {
    "h200": (
        DeterminismConfig("mha-hd64-full-edge", batch=2, seqlen_q=1000, seqlen_k=1029, nheads=8,
                          nheads_kv=8, head_dim=64),
        DeterminismConfig("mha-hd128-causal", batch=2, seqlen_q=1027, seqlen_k=1027, nheads=8,
                          nheads_kv=8, head_dim=128, causal=True, seed=1),
        DeterminismConfig("gqa-hd128-full-tile", batch=2, seqlen_q=1040, seqlen_k=1040, nheads=8,
                          nheads_kv=2, head_dim=128, seed=2),
        DeterminismConfig("mqa-hd128-causal-sq<sk", batch=2, seqlen_q=700, seqlen_k=1024,
                          nheads=8, nheads_kv=1, head_dim=128, causal=True, seed=3),
        DeterminismConfig("mha-hd128-local", batch=2, seqlen_q=1024, seqlen_k=1024, nheads=8,
                          nheads_kv=8, head_dim=128, window=(256, 64), seed=4),
        DeterminismConfig("gqa-hd64-local-softcap", batch=2, seqlen_q=513, seqlen_k=513,
                          nheads=8, nheads_kv=4, head_dim=64, window=(100, 0), softcap=15.0,
                          seed=5),
        DeterminismConfig("mha-hd128-softcap", batch=2, seqlen_q=513, seqlen_k=513, nheads=8,
                          nheads_kv=8, head_dim=128, softcap=15.0, seed=6),
        DeterminismConfig("mha-hd128-causal-sink", batch=2, seqlen_q=640, seqlen_k=640, nheads=8,
                          nheads_kv=8, head_dim=128, causal=True, sink=True, seed=7),
        DeterminismConfig("gqa-hd64-varlen-causal", nheads=8, nheads_kv=2, head_dim=64,
                          causal=True, varlen=True, seqlens_q=(300, 1, 513, 128, 0, 77),
                          seqlens_k=(300, 1, 513, 128, 5, 77), seed=8),
        DeterminismConfig("mha-hd128-varlen-full", nheads=4, nheads_kv=4, head_dim=128,
                          varlen=True, seqlens_q=(129, 1000, 64), seqlens_k=(257, 640, 1),
                          seed=9),
        DeterminismConfig("mha-fp16-hd128-full", batch=2, seqlen_q=512, seqlen_k=768, nheads=8,
                          nheads_kv=8, head_dim=128, dtype="fp16", seed=10),
        DeterminismConfig("mha-hd64-tiny-edge", batch=3, seqlen_q=1, seqlen_k=129, nheads=2,
                          nheads_kv=2, head_dim=64, seed=11),
        DeterminismConfig("mha-hd192-dv128-causal", batch=2, seqlen_q=1000, seqlen_k=1000,
                          nheads=8, nheads_kv=8, head_dim=192, head_dim_v=128, causal=True,
                          seed=12, upstream_xfail=(_XF_SM90_192,)),
        DeterminismConfig("gqa-hd192-dv128", batch=2, seqlen_q=512, seqlen_k=512, nheads=8,
                          nheads_kv=2, head_dim=192, head_dim_v=128, seed=13,
                          upstream_xfail=(_XF_SM90_192,)),
        DeterminismConfig("mha-hd256-full", batch=2, seqlen_q=520, seqlen_k=520, nheads=4,
                          nheads_kv=4, head_dim=256, seed=14, upstream_xfail=(_XF_SM90_256,)),
        DeterminismConfig("gqa-hd256-causal", batch=1, seqlen_q=500, seqlen_k=500, nheads=4,
                          nheads_kv=2, head_dim=256, causal=True, seed=15,
                          upstream_xfail=(_XF_SM90_256,)),
    ),
    # small problems for CPU backends (twin, torch-math) and CI
    "cpu": (
        DeterminismConfig("mha-hd64-full", batch=1, seqlen_q=33, seqlen_k=47, nheads=2,
                          nheads_kv=2, head_dim=64),
        DeterminismConfig("gqa-hd64-causal", batch=1, seqlen_q=40, seqlen_k=40, nheads=4,
                          nheads_kv=2, head_dim=64, causal=True, seed=1),
        DeterminismConfig("mqa-hd128-local-softcap", batch=1, seqlen_q=24, seqlen_k=31, nheads=2,
                          nheads_kv=1, head_dim=128, window=(8, 3), softcap=15.0, seed=2),
        DeterminismConfig("mha-hd64-sink", batch=1, seqlen_q=20, seqlen_k=20, nheads=2,
                          nheads_kv=2, head_dim=64, sink=True, seed=3),
        DeterminismConfig("mha-hd64-varlen", nheads=2, nheads_kv=2, head_dim=64, varlen=True,
                          seqlens_q=(5, 0, 17), seqlens_k=(9, 3, 17), seed=4),
        # >= 3 KV tiles (SM90 tile_n = 128 for hd <= 128): with 1 or 2 partial sums per dQ
        # element the order of the fp32 reduce-adds cannot change the result (commutativity),
        # so an order fault is only observable from 3 tiles on.
        DeterminismConfig("mha-hd64-kv-tiles", batch=1, seqlen_q=24, seqlen_k=520, nheads=1,
                          nheads_kv=1, head_dim=64, seed=5),
        DeterminismConfig("mqa-hd128-causal-kv-tiles", batch=1, seqlen_q=64, seqlen_k=400,
                          nheads=2, nheads_kv=1, head_dim=128, causal=True, seed=6),
    ),
}
#: timing shapes (deterministic vs default cost): the paper's setting is hd128, causal and not.
TIMING_CONFIGS: tuple[DeterminismConfig, ...] = (
    DeterminismConfig("time-mha-hd128-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=128, causal=True),
    DeterminismConfig("time-mha-hd128-full", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=128),
    DeterminismConfig("time-gqa-hd128-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=4, head_dim=128, causal=True),
    DeterminismConfig("time-mha-hd64-causal", batch=4, seqlen_q=4096, seqlen_k=4096, nheads=16,
                      nheads_kv=16, head_dim=64, causal=True),
)


def select_configs(spec: str | Sequence[str] | None, default: str = "h200"
                   ) -> tuple[DeterminismConfig, ...]:
    """Resolve ``--configs``: matrix names (``h200``, ``cpu``), configuration names from any
    matrix, a glob over names (``gqa-*``), or ``@file.json`` (a JSON list of configuration
    objects). Comma-separated items are allowed. Raises ``ValueError`` naming an unknown item or an
    invalid configuration; duplicates (same :meth:`DeterminismConfig.key`) are removed."""
    import fnmatch
    items: list[str] = []
    if spec is None or spec == "" or spec == ():
        items = [default]
    else:
        for s in ([spec] if isinstance(spec, str) else spec):
            items += [x.strip() for x in s.split(",") if x.strip()]
    by_name: dict[str, DeterminismConfig] = {}
    for m in MATRICES.values():
        for c in m:
            by_name.setdefault(c.name, c)
    for c in TIMING_CONFIGS:
        by_name.setdefault(c.name, c)
    out: list[DeterminismConfig] = []
    for it in items:
        if it in MATRICES:
            out += MATRICES[it]
        elif it.startswith("@"):
            path = it[1:]
            try:
                with open(path) as f:
                    raw = json.load(f)
            except (OSError, json.JSONDecodeError) as ex:
                raise ValueError(f"cannot read configurations from {path!r}: {ex}") from None
            if not isinstance(raw, list):
                raise ValueError(f"{path!r} must hold a JSON list of configuration objects")
            for d in raw:
                out.append(DeterminismConfig.from_json(d))
        elif any(ch in it for ch in "*?["):
            hit = [c for n, c in by_name.items() if fnmatch.fnmatchcase(n, it)]
            if not hit:
                raise ValueError(f"configuration pattern {it!r} matches nothing")
            out += hit
        elif it in by_name:
            out.append(by_name[it])
        else:
            raise ValueError(f"unknown configuration or matrix {it!r}; matrices: "
                             f"{sorted(MATRICES)}, e.g. names: {sorted(by_name)[:6]} ...")
    seen, uniq = set(), []
    for c in out:
        errs = validate_config(c)
        if errs:
            raise ValueError(f"invalid configuration {c.name!r}: " + "; ".join(errs))
        if c.key() not in seen:
            seen.add(c.key())
            uniq.append(c)
    return tuple(uniq)
