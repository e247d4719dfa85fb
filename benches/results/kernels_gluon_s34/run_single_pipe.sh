#!/usr/bin/env bash
# Session 34, device call B (repo root, carry [".bundle", "dist"]): single requests (8 (request, KV head)
# pairs, where the launcher keeps the Triton stage 1) on Gluon variants that keep tiles in flight per
# program -- register prefetch with every later feature (rp_*) and deeper TMA rings (t3 / t4 / t4x2) --
# at the launcher's split count (128: ~8 one-warp programs per SM, the grid, not the registers, bounds
# them) and at 12 programs per SM, INT2 and INT4, 2K-128K tokens; their GPU tests first.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=100 -rfE \
  tests/test_kernels_decode_gluon.py -k "variants_match_reference and (rp_ or t4 or t3x2)" > "$OUT/gpu_tests_pipe.log" 2>&1
tail -3 "$OUT/gpu_tests_pipe.log"
timeout 330 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,rp_fslwnk,rp_r168fslwnk,dnp_r128fslwnkt3,dnp_r168fslwnkt4,dnp_r168fslwnkt4x2 \
  --gluon-waves 12 --gluon-max-splits 512 --shapes 1x131072,1x32768,1x8192,1x2048 --out "$OUT" > "$OUT/bench_single.log" 2>&1
mv "$OUT/gluon.md" "$OUT/pipe_single.md"; mv "$OUT/gluon.json" "$OUT/pipe_single.json"
grep -v "^|---" "$OUT/pipe_single.md"
