"""fa4verify.kernels — the subject under test.

* ``adapter``  — production FA4: the one importer of ``flash_attn.cute`` for production kernels.
* ``fa4_params`` — coefficients, thresholds and tuning tables read from the installed FA4 (the one
  importer of ``flash_attn.cute`` for FA4's parameters), with a pinned fallback copy used only
  when FA4 is absent.
* ``fa4_device`` — FA4's device functions for the probe kernels (the one importer of
  ``flash_attn.cute`` for them).
* ``probes``   — CuTe-DSL kernels that run FA4's own device functions in isolation.
* ``twin``     — the bit-exact CPU twin (package: ``exp2``, ``fp32``, ``forward``, ``backward``,
  ``attention``).
* ``facts``, ``device``, ``golden``, ``evidence`` — kernel facts, the local GPU, golden vectors and
  recorded evidence.

Imports run one way: ``kernels`` may import ``fa4verify.oracles`` (the exact binary32 kit) and
``fa4verify.error_budgets``, never the judge (the rest of ``fa4verify``);
``tests/test_import_direction.py`` checks it.
"""
