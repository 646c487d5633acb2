"""Bitwise reproducibility of FA4's deterministic backward, one concept per module:
:mod:`~fa4verify.determinism.schema` (record vocabulary), :mod:`~fa4verify.determinism.bitwise`
(digests, bitwise comparison), :mod:`~fa4verify.determinism.guard` (guard bands),
:mod:`~fa4verify.determinism.configs` (the configuration matrix), :mod:`~fa4verify.determinism.inputs`,
:mod:`~fa4verify.determinism.backends` (kernels, through the target layer),
:mod:`~fa4verify.determinism.runner` (in-process runs, timing), :mod:`~fa4verify.determinism.workers`
(fresh processes: the engine's workers), :mod:`~fa4verify.determinism.report`
(aggregation, exit status) and :mod:`~fa4verify.determinism.manifest` (digest manifests). This
package re-exports every name its callers import.

What is checked
---------------
For every configuration of the matrix, FA4's backward with ``deterministic=True`` runs ``runs``
times in each of ``processes`` freshly started Python processes (and on each selected device). Before
every run the output buffers dQ, dK, dV are re-armed: the interior is filled with NaN and
``guard`` extra elements before and after each buffer hold a sentinel bit pattern
(:data:`SENTINEL_BITS`, a signalling-NaN payload no kernel produces). After every run

* the guard bands must still hold the sentinel bit for bit (else: out-of-bounds write),
* the interior must hold no NaN (else: an element was never written, or a NaN was produced),
* the SHA-256 digest of the raw bytes of dQ, dK, dV (and dsink) is recorded.

The configuration is *reproducible* when every run, in every process, on every device, gives the
same digest for every tensor, the inputs' digest being the same everywhere (inputs are generated on
the CPU from the configuration's seed, so a changed generator cannot masquerade as
non-determinism). The default (non-deterministic) mode is run too, and its divergence is measured
bitwise: elements that differ from the first default run, and the largest difference in ULPs of the
output dtype (sign-magnitude integer distance, so a step across zero counts one ULP per
representable value crossed).

Statuses (:data:`STATUSES`): ``reproducible``, ``not-reproducible``, ``guard-violation``,
``unwritten`` (NaN left in the output), ``unsupported`` ("not supported by FA4 for this
configuration": FA4 rejected it with an assertion or ValueError before running it), ``xfail``
(not reproducible, but upstream marks the configuration xfail on this arch), ``xpass``
(reproducible although upstream marks it xfail), ``error`` (anything else: a crash, a missing
backend), ``not-run`` (the time budget ran out).

Where figures come from: the ``fa4`` backend runs the production kernels through
:class:`fa4verify.targets.ProductionTarget` ("measured on <GPU> (sm_XY)"); ``twin`` runs the CPU twin
through :class:`fa4verify.targets.TwinTarget` ("CPU twin"); ``torch-math`` is an fp32 PyTorch reference
that exercises the harness itself on the CPU ("CPU"). A backend can also be named ``module:attr``.

Possible issues
---------------
* Bitwise reproducibility is a property of (kernel, configuration, GPU, driver, versions). A
  manifest recorded elsewhere is compared as "different environment", never as a failure, unless
  ``strict_env`` is asked for.
* Fresh processes share nothing but the files on disk. FA4's optional on-disk kernel cache
  (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) is turned off in the workers, so every process
  compiles its own kernels.
"""
from __future__ import annotations

from fa4verify.determinism.schema import (SCHEMA_MANIFEST, SCHEMA_REPORT, SCHEMA_WORKER, TENSORS, GUARDED,
                                          STATUSES, FAILING, UNSUPPORTED_MSG)
from fa4verify.determinism.bitwise import (as_tensor, bits, is_nan_bits, ordered, BitDiff, compare_bitwise,
                                           nan_count, digest)
from fa4verify.determinism.guard import (SENTINEL_BITS, GUARD_BYTES, GuardReport, GuardedBuffer)
from fa4verify.determinism.configs import (Dtype, DeterminismConfig, validate_config, MATRICES,
                                           TIMING_CONFIGS, select_configs)
from fa4verify.determinism.inputs import (Problem, make_inputs)
from fa4verify.determinism.backends import (Grads, Backend, Fa4Backend, TorchMathBackend, TwinBackend,
                                            load_backend)
from fa4verify.determinism.runner import (run_config, time_backward)
from fa4verify.determinism.workers import (resolve_devices, worker_spec, run_worker_spec, spawn_workers)
from fa4verify.determinism.report import (aggregate, exit_status)
from fa4verify.determinism.manifest import (ENV_KEY_FIELDS, environment_key, build_manifest, load_manifest,
                                            Outcome, compare_manifests, git_commit)
