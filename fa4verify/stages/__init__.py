"""FA4 stage by stage: each stage of the forward and backward against its own budget.

* :mod:`fa4verify.stages.budgets` -- the CPU twin's stages and the composed budgets, and which
  stage an error comes from (attribution);
* :mod:`fa4verify.stages.taps` -- production FA4's backward stage buffers (the subject side is
  :mod:`fa4verify.kernels.stage_taps`) judged against their budgets.
"""
