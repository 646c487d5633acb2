"""fa4verify.oracles — the truth: mpmath arbiters and fast certified references.

``oracles`` never imports ``fa4verify.kernels``.
"""
