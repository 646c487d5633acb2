"""Compile-only work on production FA4 (no GPU): what its compiler emits and whether it builds.

* :mod:`fa4verify.compile.census` -- the instruction census of FA4's compiled kernels (PTX, SASS);
* :mod:`fa4verify.compile.census_atomics` -- the dQ-path atomics and the semaphore that orders
  them (the static side of the deterministic backward);
* :mod:`fa4verify.compile.production` -- production FA4 compiled through the target layer;
* :mod:`fa4verify.compile.features` -- FA4's features (split-KV, paged KV, block sparsity, MLA,
  fp8, ...) compiled through the adapter.
"""
