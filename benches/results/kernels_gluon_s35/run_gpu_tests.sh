#!/usr/bin/env bash
# Session 35, device call C (repo root, carry [".bundle", "dist"]): the rule at GLUON_SPLIT_WRITE_PAIRS
# (192, 512): its routing and split-form GPU tests, the write's and the Triton decode's GPU test files.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout ${TEST_TIMEOUT:-300} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=250 -rfE \
  tests/test_kernels_write.py tests/test_kernels_decode.py \
  "tests/test_kernels_decode_gluon.py::test_the_default_decode_picks_its_gluon_variant_and_split_count_by_waves" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -8 "$OUT/gpu_tests.log"
