"""FA4's device functions for the probe kernels (``flash_attn.cute.utils``).

The one importer of ``flash_attn.cute`` for the probes' device functions: every probe kernel in
:mod:`fa4verify.kernels.probes` that calls one of FA4's own device functions
(``ex2_emulation``, ``ex2_emulation_2``, the ``cvt`` helpers ...) reads it from :data:`fa_utils`
here, so the probes run exactly the functions the production kernels run and there is one place
that names FA4's module. Production kernels go through :mod:`fa4verify.kernels.adapter`, FA4's
numeric knobs through :mod:`fa4verify.kernels.fa4_params`.

Importing this module imports ``flash_attn.cute.utils`` (and the CuTe DSL); only the probe modules,
which need the DSL anyway, import it.
"""
from __future__ import annotations

from flash_attn.cute import utils as fa_utils

__all__ = ["fa_utils"]
