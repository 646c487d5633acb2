#!/usr/bin/env bash
# GPU check of tests/conftest.py: on a machine with CUDA and FA4 the `gpu`
# tests run instead of skipping, the conftest tests take their GPU branches, and the tests of
# "no GPU" behaviour (`no_cuda` fixture) skip with "a CUDA device is present (...)".
#
#   bash scripts/gpu_hygiene.sh          # writes $OUT/hygiene/pytest.log; about 3-4 minutes
#
# Uses the prepared environment /root/site/env.sh when it is there (as scripts/gpu.sh does), else the
# current python3 (needs torch with CUDA, flash-attn-4 4.0.0b36, pytest, hypothesis).
set -uo pipefail
[ -f /root/site/env.sh ] && . /root/site/env.sh
R="${OUT:-/tmp/out}/hygiene"; mkdir -p "$R"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$R/pip.log" 2>&1
nvidia-smi -L > "$R/gpu.txt" 2>&1
t0=$(date +%s)
timeout 540 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_conftest_markers.py tests/test_import_layering.py \
  tests/test_gpu_probes.py tests/test_gpu_determinism_smoke.py tests/test_gpu_adapter_nocuda.py \
  tests/test_determinism_cli.py::test_fa4_backend_without_gpu_exits_2_with_the_reason \
  tests/test_mutants_cli.py::test_production_target_without_gpu_is_a_usage_error \
  > "$R/pytest.log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$R/pytest.log"
grep -v -i warn "$R/pytest.log" | tail -25
