#!/usr/bin/env bash
# Session 33, device call A (repo root, carry [".bundle", "dist", ".peers"]): setup, the authors'
# build started in the background at low priority (for regenerate.sh, call C), the GPU test files whole.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
rm -f /tmp/authors_done
setsid nohup nice -n 19 bash -c 'MAX_JOBS=12 OUT= bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build \
  > /tmp/authors_build.log 2>&1; echo rc=$? > /tmp/authors_done' > /dev/null 2>&1 < /dev/null &
OMP_NUM_THREADS=1 timeout 500 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=300 -rfE \
  tests/test_kernels_decode.py tests/test_kernels_decode_gluon.py > "$OUT/gpu_tests.log" 2>&1
tail -15 "$OUT/gpu_tests.log"
tail -2 /tmp/authors_build.log; cat /tmp/authors_done 2>/dev/null || echo "authors build still running"
