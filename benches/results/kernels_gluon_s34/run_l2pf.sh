#!/usr/bin/env bash
# Session 34, device call F (repo root, carry [".bundle", "dist"]): the sealed tiles' lines prefetched
# into L2 (GluonVariant.l2_prefetch: v = the tile's value lines at its start, n = the next tile, b = both)
# against the default variant, whole steps, INT2 and INT4; their GPU tests first.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=90 -rfE \
  tests/test_kernels_decode_gluon.py -k "variants_match_reference and (fslwnkv or fslwnkn or fslwnkb)" > "$OUT/gpu_tests_l2pf.log" 2>&1
tail -3 "$OUT/gpu_tests_l2pf.log"
timeout 330 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,dnp_r128fslwnkv,dnp_r128fslwnkn,dnp_r128fslwnkb \
  --shapes 8x32768,16x65536,32x8192,64x4096,8x4096,1x131072,1x32768 --out "$OUT" > "$OUT/bench_l2pf.log" 2>&1
mv "$OUT/gluon.md" "$OUT/l2pf.md"; mv "$OUT/gluon.json" "$OUT/l2pf.json"
grep -v "^|---" "$OUT/l2pf.md"
