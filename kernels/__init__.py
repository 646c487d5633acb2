"""fa4verify.kernels — the subject under test.

* ``adapter``  — the only module that imports ``flash_attn.cute`` (production FA4).
* ``probes``   — CuTe-DSL kernels that run FA4's own device functions in isolation.
* ``twin``     — bit-exact CPU models of FA4's numeric stages (exp2 emulation, column rule).
* ``fa4_params`` — coefficients, thresholds and tuning tables read from the installed FA4,
  with a pinned fallback copy used only when FA4 is absent.
"""
