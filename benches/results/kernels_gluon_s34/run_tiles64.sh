#!/usr/bin/env bash
# Session 34, device call A (repo root, carry [".bundle", "dist"]): 64-token sealed tiles
# (GluonVariant.block_n, dnp_r1xxfslwn64) on the GPU: their GPU tests, then whole decode steps side by
# side with the default variant (dnp_r128fslwnk, 32-token tiles) and the fused Triton step, INT2 and
# INT4, at the launcher's split count and at 12 programs per SM (the 168-register cap's one wave);
# single requests also at 8 / 16 programs per SM.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=120 -rfE \
  tests/test_kernels_decode_gluon.py -k "fslwn64 or 64_token" > "$OUT/gpu_tests_64.log" 2>&1
tail -4 "$OUT/gpu_tests_64.log"
timeout 230 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,dnp_r128fslwn64,dnp_r144fslwn64,dnp_r168fslwn64 --gluon-waves 12 \
  --shapes 8x32768,16x65536,32x8192,64x4096 --out "$OUT" > "$OUT/bench_multi.log" 2>&1
mv "$OUT/gluon.md" "$OUT/tiles64_multi.md"; mv "$OUT/gluon.json" "$OUT/tiles64_multi.json"
timeout 150 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,dnp_r128fslwn64,dnp_r168fslwn64 --gluon-waves 8,16 --gluon-max-splits 512 \
  --shapes 1x131072,1x32768,1x8192 --out "$OUT" > "$OUT/bench_single.log" 2>&1
mv "$OUT/gluon.md" "$OUT/tiles64_single.md"; mv "$OUT/gluon.json" "$OUT/tiles64_single.json"
for f in tiles64_multi tiles64_single; do echo "== $f"; grep -v "^|---" "$OUT/$f.md"; done
