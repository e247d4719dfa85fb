#!/usr/bin/env bash
# Session 42, call D (repo root, carry [".bundle", "dist"], the machine of call C still held): the Gluon
# decode and write GPU test files whole, with the lane-form variants and the launcher's rule.
set -u
source benches/results/kernels_gluon_s37/prelude.sh >/dev/null
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
t0=$SECONDS
OMP_NUM_THREADS=1 timeout 280 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -q --timeout=150 -rfE \
  tests/test_kernels_decode_gluon.py tests/test_kernels_write.py > "$OUT/gpu_tests_gluon_write.log" 2>&1
echo "rc $? at $((SECONDS - t0)) s"; tail -5 "$OUT/gpu_tests_gluon_write.log"
