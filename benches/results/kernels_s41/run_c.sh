#!/usr/bin/env bash
# Session 41, call C (repo root, carry [".bundle", "dist", ".peers"]): with merge_one_pass the launcher's
# default from MERGE_ONE_PASS_PARTS partials on (call B's timings) and the Gluon routing test fixed for
# SPREAD_OPEN: the GPU tests of the decode and kernel-path files (run_tests_default.sh's selection, plus
# one_pass and the default-routing tests), then the launcher's default against the chunked merge forced,
# whole steps side by side (NO_AB=1 leaves it out), and $OUT packed into one out.tar.xz.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -q --timeout=90 -rfE \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py tests/test_kernels_decode_gluon.py \
  -k "((real_sizes or graph or spread or one_pass) and not cpu) or default_decode_runs_the_fused_triton_step" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/gpu_tests.log"
[ "${NO_AB:-0}" = 1 ] || timeout 90 python3 benches/kernels/tuning_ab.py --agree 1e-3 --a merge_one_pass=False --b merge_one_pass=None --formats group \
  --bits 2 --repeats 5 --shapes 1x2048,1x131072,4x32768,16x65536 --out "$OUT/ab_default" > "$OUT/ab_default.log" 2>&1
echo "ab rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_default/ab.md" 2>/dev/null || tail -5 "$OUT/ab_default.log"
(cd "$OUT" && tar cJf /tmp/out.tar.xz . && find . -mindepth 1 -delete && mv /tmp/out.tar.xz . && ls -la)
