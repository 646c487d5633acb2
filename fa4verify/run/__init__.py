"""The execution engine: every check, fuzz campaign, determinism matrix and ``--gpus`` audit runs here.

:mod:`~fa4verify.run.engine` plans (cases grouped by FA4 compile key, longest first), runs and
merges (Note [One engine]); :mod:`~fa4verify.run.pool` is the worker pool (isolation, per-task
deadline and kill, crash replacement, workers pinned one per GPU); :mod:`~fa4verify.run.worker`
the worker process, the one place a check is called; :mod:`~fa4verify.run.zygote` forks GPU
workers with torch and FA4 already imported.
"""
