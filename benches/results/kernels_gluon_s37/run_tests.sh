#!/usr/bin/env bash
# Session 37, call C (repo root, carry [".bundle", "dist"]): the decode and write GPU test files whole on this
# commit's kernels (the working tree's, copied over the installed wheel's), then the other kernel files while
# time is left.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
OMP_NUM_THREADS=1 timeout $((440 - (SECONDS - t0))) python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=300 -rfE \
  tests/test_kernels_decode.py tests/test_kernels_decode_gluon.py tests/test_kernels_write.py > "$OUT/gpu_tests.log" 2>&1
echo "decode/gluon/write rc $? at $((SECONDS - t0)) s"; tail -6 "$OUT/gpu_tests.log"
left=$((580 - (SECONDS - t0)))
if [ $left -gt 60 ]; then
  OMP_NUM_THREADS=1 timeout $left python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=200 -rfE \
    tests/test_kernels_extend.py tests/test_kernels_page_grid.py tests/test_kernels_seal.py > "$OUT/gpu_tests_other.log" 2>&1
  echo "extend/page_grid/seal rc $? at $((SECONDS - t0)) s"; tail -6 "$OUT/gpu_tests_other.log"
fi
