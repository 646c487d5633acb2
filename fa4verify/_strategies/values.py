"""The strategy for the values of a problem: :func:`value_specs` draws a
:class:`~fa4verify.problem.values.ValueSpec` (the distributions are described in
:mod:`fa4verify.problem.values`).
"""
from __future__ import annotations

from typing import Optional

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify.problem.values import DISTRIBUTIONS, ValueSpec

#: what :func:`value_specs` draws when not told: every distribution but ``"edges"``, whose rows the
#: coverage plan places by construction (ask for it with ``distributions=``)
DRAWN_DISTRIBUTIONS: tuple[str, ...] = DISTRIBUTIONS[:-1]


def _limits(dtype: str) -> dict[str, int]:
    return {"e_qk": 10, "e_v": 20, "tiny": 30} if dtype == "bf16" else {"e_qk": 6, "e_v": 10, "tiny": 16}


@st.composite
def value_specs(draw: DrawFn, *, dtype: str, distributions: Optional[tuple[str, ...]] = None,
                sinks: bool = False) -> ValueSpec:
    """A :class:`ValueSpec` for ``dtype`` over ``distributions`` (default: all of
    :data:`DISTRIBUTIONS`). With ``sinks``, sink parameters are drawn too. Shrinks toward
    ``ValueSpec("normal", 0, sigma=1)``."""
    dists = DRAWN_DISTRIBUTIONS if distributions is None else tuple(distributions)
    bad = [d for d in dists if d not in DISTRIBUTIONS]
    if bad or not dists:
        raise InvalidArgument(f"distributions={distributions!r}: unknown {bad} (known: {DISTRIBUTIONS})")
    if dtype not in ("bf16", "fp16"):
        raise InvalidArgument(f"dtype={dtype!r} must be 'bf16' or 'fp16'")
    lim = _limits(dtype)
    dist = draw(st.sampled_from(dists))
    seed = draw(st.integers(0, 2**32 - 1))
    p: dict[str, float] = {}
    if dist == "normal":
        p["sigma"] = draw(st.sampled_from((1.0, 0.5, 2.0, 4.0)))
    elif dist == "outliers":
        p["p"] = draw(st.sampled_from((0.001, 0.01, 0.05)))
        p["outlier_std"] = 100.0
    elif dist == "negative_scores":
        p["shift"] = draw(st.one_of(st.sampled_from((100.0, 20.0, 1000.0, 5000.0)), st.floats(10.0, 5000.0)))
    elif dist == "peaked_rescale":
        p["delta"] = draw(st.one_of(st.sampled_from((8.0, 7.9, 8.1, 7.5, 8.5, 7.999, 8.001, 16.0, 4.0)),
                                    st.floats(2.0, 20.0)))
        p["tile_n"] = float(draw(st.sampled_from((128, 64, 80, 112, 144))))
        p["sigma"] = draw(st.sampled_from((0.1, 0.0, 0.5)))
    elif dist == "huge":
        p["e_qk"] = float(draw(st.integers(2, lim["e_qk"])))
        p["e_v"] = float(draw(st.integers(0, lim["e_v"])))
    elif dist == "tiny":
        p["e"] = float(draw(st.integers(4, lim["tiny"])))
    elif dist == "edges":
        p["score"] = draw(st.sampled_from((6.0, 4.0, 9.0)))
    if sinks:
        p["sink_scale"] = draw(st.sampled_from((1.0, 4.0, 16.0)))
        p["sink_shift"] = draw(st.sampled_from((0.0, 5.0, -5.0, 50.0, -50.0)))
    return ValueSpec(dist, seed, tuple(p.items()))
