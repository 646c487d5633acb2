"""FA4's exp2: the exhaustive certification of its polynomial emulation and the recorded MUFU path.

* :mod:`fa4verify.exp2.cert` -- every fp32 input of a range through the CPU twin's emulation,
  against the certified bound (CPU);
* :mod:`fa4verify.exp2.device` -- the same sweep of FA4's own device functions on a GPU;
* :mod:`fa4verify.exp2.mufu_stats` -- the MUFU ``ex2.approx`` statistics recorded on a GPU.

The audit checks are in :mod:`fa4verify.checks.exp2`, the command in :mod:`fa4verify.cli.exp2`.
"""
