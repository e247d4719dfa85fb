#!/usr/bin/env bash
# Session 34, device call C (same machine as B): the register-prefetch variants with every later feature
# (rp_r168fslwnk / rp_r152fslwnk: 12-13 programs per SM) against the default variant at 64-512 pairs,
# at the launcher's split count and at 12 programs per SM, INT2 and INT4.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,rp_r168fslwnk,rp_r152fslwnk --gluon-waves 12 \
  --shapes 8x32768,16x65536,32x8192,64x4096 --out "$OUT" > "$OUT/bench_multi.log" 2>&1
mv "$OUT/gluon.md" "$OUT/prefetch_multi.md"; mv "$OUT/gluon.json" "$OUT/prefetch_multi.json"
grep -v "^|---" "$OUT/prefetch_multi.md"
