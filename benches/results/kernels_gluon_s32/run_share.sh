#!/usr/bin/env bash
# Session 32, second device call (repo root, carry [".bundle", "dist"]): the two defaults with the
# open-page program sharing the sealed tiles (open_share), at the one-wave split count (@fit), against
# the launcher from 128 to 1024 (request, KV head) pairs; paper and server (page-grid) formats.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=100 -rfE \
  tests/test_kernels_decode_gluon.py -k "fslwnkx or fslwnpx" > "$OUT/gpu_tests_share.log" 2>&1; tail -2 "$OUT/gpu_tests_share.log"
timeout 220 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-variants dnp_r128fslwnkx --gluon-fit \
  --shapes 16x8192,20x8192,32x8192,48x8192,64x4096,96x4096,128x4096,128x2048 --out "$OUT" > "$OUT/bench_group.log" 2>&1
mv "$OUT/gluon.md" "$OUT/share_group.md"; rm -f "$OUT/gluon.json"
timeout 150 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-format page --gluon-block-n 32 \
  --gluon-variants dnp_r128fslwnpx --gluon-fit --shapes 16x8192,32x8192,64x4096,96x4096,128x4096 --out "$OUT" \
  > "$OUT/bench_page.log" 2>&1
mv "$OUT/gluon.md" "$OUT/share_page.md"; rm -f "$OUT/gluon.json"
for f in share_group share_page; do echo "== $f"; grep -v "^|---" "$OUT/$f.md"; done
