#!/usr/bin/env bash
# Session 34, device call H (repo root, carry [".bundle", "dist"]): both GPU kernel test files whole on
# the new defaults (the value-line L2 prefetch in all four Gluon defaults).
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 430 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=300 -rfE \
  tests/test_kernels_decode.py tests/test_kernels_decode_gluon.py > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -15 "$OUT/gpu_tests.log"
