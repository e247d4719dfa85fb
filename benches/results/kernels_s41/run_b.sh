#!/usr/bin/env bash
# Session 41, call B (repo root, carry [".bundle", "dist", ".peers"]; one command of at most 600 s), after
# call A (kernels_s39/run.sh: the regeneration, whose GPU tests lacked the sgl_kernel stand-in):
# 1. the GPU tests with SPREAD_OPEN the default, the stand-in on the path (run_tests_default.sh);
# 2. the Gluon decode and fused-write GPU tests (bounded at 150 s);
# 3. where 1-2 ended before ONE_PASS_BEFORE s (default 260), merge_one_pass's GPU tests and timings
#    (run_one_pass.sh);
# then $OUT packed into one out.tar.xz (the device returns at most 8 files).
set -u
t0=$SECONDS
bash benches/results/kernels_gluon_s37/run_tests_default.sh
(source benches/results/kernels_gluon_s37/prelude.sh > /dev/null
 OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=120 -rfE \
   tests/test_kernels_decode_gluon.py tests/test_kernels_write.py > "$OUT/gpu_tests_gluon_write.log" 2>&1
 echo "gluon + write pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests_gluon_write.log")
if [ $((SECONDS - t0)) -lt ${ONE_PASS_BEFORE:-260} ]; then
  bash benches/results/kernels_gluon_s37/run_one_pass.sh
else
  echo "merge_one_pass left out: $((SECONDS - t0)) s spent"
fi
(cd "$OUT" && tar cJf /tmp/out.tar.xz . && find . -mindepth 1 -delete && mv /tmp/out.tar.xz . && ls -la)
