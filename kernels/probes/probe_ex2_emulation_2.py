"""Former name of :mod:`fa4verify.kernels.probes.probe_ex2_emulation_packed` (the probe of FA4's
PACKED ``utils.ex2_emulation_2``), kept so that old imports, scripts and the probe key
``"ex2_emulation_2"`` in recorded evidence and census tables still resolve. New code imports
``probe_ex2_emulation_packed``."""
from fa4verify.kernels.probes.probe_ex2_emulation_packed import *  # noqa: F401,F403
from fa4verify.kernels.probes.probe_ex2_emulation_packed import (  # noqa: F401
    ARCHS, IN_DTYPES, MIRRORS, OUT_SPECS, STAGE, VARIANTS, compile_only, launch, run)
