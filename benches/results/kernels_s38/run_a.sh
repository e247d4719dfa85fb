#!/usr/bin/env bash
# Session 38, call A (repo root, carry [".bundle", "dist", ".peers"]): session 37's two prepared runs in one
# call. (1) The GPU tests with SPREAD_OPEN the launcher's default for single requests (decode real sizes,
# CUDA graphs, spread_open; the backend kernel path's CUDA-graph tests on real SGLang classes) and
# merge_one_pass's tests. (2) merge_one_pass timed against the chunked merge, whole steps side by side.
# (3) A single request's step kernel by kernel with it.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=120 -rfE \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py \
  -k "((real_sizes or graph or spread) and not cpu) or one_pass" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests.log"
for f in group page; do
  bits=2,4; [ $f = page ] && bits=2
  timeout 140 python3 benches/kernels/tuning_ab.py --agree 1e-3 --a merge_one_pass=False --b merge_one_pass=True --formats $f \
    --bits $bits --repeats 5 --shapes 1x2048,1x8192,1x32768,1x131072,2x65536,4x32768,8x32768,16x65536 \
    --out "$OUT/ab_$f" > "$OUT/ab_$f.log" 2>&1
  echo "$f rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_$f/ab.md" 2>/dev/null || tail -5 "$OUT/ab_$f.log"
done
timeout 60 python3 benches/kernels/step_kernels.py --shapes 1x2048,1x32768,1x131072 --bits 2 --set merge_one_pass=True \
  --out "$OUT/step_kernels_one_pass.json" > "$OUT/step_kernels_one_pass.log" 2>&1
echo "step_kernels rc $? at $((SECONDS - t0)) s"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_one_pass.log" | cut -c1-160
