#!/usr/bin/env bash
# Session 32, one device call (repo root, carry [".bundle", "dist"]): the early-loads variants
# (GluonVariant.early_loads) side by side with the defaults they extend. Results land in $OUT.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -2 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python OSCAR_COMMIT=${OSCAR_COMMIT:-$(git rev-parse --short HEAD)}
# 1. the new variants' GPU tests (reference, the step with the write, page-grid ranges)
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=120 -rfE \
  tests/test_kernels_decode_gluon.py -k "fslwnke or fslwnpe or fslwnkex" > "$OUT/gpu_tests_early.log" 2>&1
tail -3 "$OUT/gpu_tests_early.log"
# 2. the write's share of the step, paper format, two runs interleaved
timeout 150 python3 benches/kernels/write_share.py --variants dnp_r128fslwnk,dnp_r128fslwnke --bits 2,4 \
  --shapes 64x4096,32x8192,8x32768 --repeats 2 --out "$OUT/write_share.json" > "$OUT/write_share.log" 2>&1
grep RESULT "$OUT/write_share.log"
# 3. whole steps, paper format: the launcher, nk, nke; nkex at its one-wave split count
mkdir -p "$OUT/step" "$OUT/fit" "$OUT/page"
timeout 170 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-variants dnp_r128fslwnk,dnp_r128fslwnke \
  --shapes 8x32768,16x65536,32x8192,64x4096,16x8192,32x1024 --out "$OUT/step" > "$OUT/step/bench.log" 2>&1
timeout 100 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-variants dnp_r128fslwnkex --gluon-fit \
  --shapes 32x8192,64x4096,16x8192,32x1024 --out "$OUT/fit" > "$OUT/fit/bench.log" 2>&1
# 4. whole steps, the INT2 server format (page-grid key ranges, 32-token tiles)
timeout 100 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-format page --gluon-block-n 32 \
  --gluon-variants dnp_r128fslwnp,dnp_r128fslwnpe --shapes 8x32768,16x65536,32x8192,64x4096 --out "$OUT/page" \
  > "$OUT/page/bench.log" 2>&1
for d in step fit page; do echo "== $d"; grep -v "^|---" "$OUT/$d/gluon.md" 2>/dev/null | head -20; done
