"""The execution engine: every check, fuzz campaign, determinism matrix and ``--gpus`` audit runs here.

* :mod:`fa4verify.run.engine` -- plan (cases grouped by FA4 compile key, longest first), run,
  merge (Note [One engine]);
* :mod:`fa4verify.run.pool` -- the worker pool: isolation, per-task deadline and kill, crash
  replacement, workers pinned one per GPU (``--gpus``);
* :mod:`fa4verify.run.worker` -- the worker process and the one place a check is called;
* :mod:`fa4verify.run.zygote` -- forks GPU workers with torch and FA4 already imported.
"""
