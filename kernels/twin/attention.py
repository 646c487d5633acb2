"""CPU twin of the FA4 attention algorithm (forward and backward) -- the public face.

Every figure computed with this module is labelled **"CPU twin"**: it is a numpy model of FA4's
numerics (SM90 and SM100 paths), bit-exact where the hardware is modelable (fp32 FMA, adds,
multiplies, conversions, FA4's polynomial exp2, reduction orders) and parameterised where it is not
(tensor-core accumulation: ``accumulation=``; MUFU ex2/rcp/lg2/tanh: ``mufu=``).

    >>> from fa4verify.kernels.twin import attention as ta
    >>> r = ta.forward(q, k, v, arch="sm100", causal=True)            # doctest: +SKIP
    >>> r.out, r.lse, r.stages["p_max"]                                  # doctest: +SKIP
    >>> g = ta.backward(q, k, v, r.out, dout, lse=r.lse, arch="sm90")   # doctest: +SKIP
    >>> g.dq, g.dk, g.dv                                                 # doctest: +SKIP

Stage switches (``exact_stages``): forward :data:`FWD_STAGES`, backward :data:`BWD_STAGES`.
Mutations (``mutations``): :data:`MUTATIONS` -- named faults for mutation testing.
The implementation lives in ``forward.py`` and ``backward.py`` of this package (their module
docstrings list what is modelled, with FA4 file references, and the known limitations); the fp32
helpers both use are in ``fp32.py``, FA4's polynomial exp2 and column rule in ``exp2.py``.
"""
from __future__ import annotations

from fa4verify.kernels.twin.backward import (  # noqa: F401
    BWD_MUTATIONS, BWD_STAGES, TwinBackwardResult, backward,
)
from fa4verify.kernels.twin.forward import (  # noqa: F401
    ACCUMULATIONS, FWD_MUTATIONS, FWD_STAGES, MUFU_BOUNDS, MUFU_MODES, Mufu, StageSample,
    TwinConfig, TwinForwardResult, cast_to, emulated_exp2, forward, mma, sm90_tile,
)

#: Every mutation name the twin implements (forward and backward).
MUTATIONS: tuple[str, ...] = tuple(FWD_MUTATIONS) + tuple(BWD_MUTATIONS)

__all__ = ["forward", "backward", "FWD_STAGES", "BWD_STAGES", "MUTATIONS", "FWD_MUTATIONS",
           "BWD_MUTATIONS", "ACCUMULATIONS", "MUFU_MODES", "MUFU_BOUNDS", "StageSample",
           "TwinConfig", "TwinForwardResult", "TwinBackwardResult", "cast_to", "mma",
           "sm90_tile", "emulated_exp2", "Mufu"]
