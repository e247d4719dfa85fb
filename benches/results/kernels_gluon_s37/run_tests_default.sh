#!/usr/bin/env bash
# Session 37, call E, NOT run (no device time was left; for the next session) (repo root, carry [".bundle", "dist", ".peers"]): with spread_open the launcher's
# default for single requests (SPREAD_OPEN), the Triton decode GPU tests at real sizes, of CUDA graphs and of
# spread_open, and the backend's kernel path's CUDA-graph tests on CUDA (real SGLang pool, allocator and backend; eager steps against CUDA-graph replays).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
# The backend's kernel-path tests build real SGLang classes on CUDA, whose modules import sgl_kernel:
# the serving harness's stand-in (benches/serving/serve.py) goes on the path, with SGLang's Python
# radix core (session 41's first call of this script, without them: 3 failed on `No module named 'sgl_kernel'`).
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=90 -rfE \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py -k "(real_sizes or graph or spread) and not cpu" \
  > "$OUT/gpu_tests_default.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests_default.log"
