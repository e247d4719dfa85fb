#!/usr/bin/env bash
# Session 34, device call G (repo root, carry [".bundle", "dist"]): the value-line L2 prefetch (suffix
# v) on each of the launcher's four Gluon defaults against the default itself, at the launcher's split
# count and at the one-wave count (@fit, where the open-share variants run), the paper format and the
# server's page-grid format (32-token tiles), INT2 and INT4; GPU tests of the new variants first.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=90 -rfE \
  tests/test_kernels_decode_gluon.py -k "fslwnkxv or fslwnpv or fslwnpxv" > "$OUT/gpu_tests_v.log" 2>&1
tail -3 "$OUT/gpu_tests_v.log"
timeout 200 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-fit \
  --gluon-variants dnp_r128fslwnk,dnp_r128fslwnkv,dnp_r128fslwnkx,dnp_r128fslwnkxv \
  --shapes 64x4096,32x8192,128x2048,2x65536,3x32768 --out "$OUT" > "$OUT/bench_v_group.log" 2>&1
mv "$OUT/gluon.md" "$OUT/v_group.md"; mv "$OUT/gluon.json" "$OUT/v_group.json"
timeout 200 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-fit --gluon-format page --gluon-block-n 32 \
  --gluon-variants dnp_r128fslwnp,dnp_r128fslwnpv,dnp_r128fslwnpx,dnp_r128fslwnpxv \
  --shapes 8x32768,16x65536,32x8192,64x4096,2x65536 --out "$OUT" > "$OUT/bench_v_page.log" 2>&1
mv "$OUT/gluon.md" "$OUT/v_page.md"; mv "$OUT/gluon.json" "$OUT/v_page.json"
for f in v_group v_page; do echo "== $f"; grep -v "^|---" "$OUT/$f.md"; done
