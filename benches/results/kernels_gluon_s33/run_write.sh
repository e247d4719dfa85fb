#!/usr/bin/env bash
# Session 33 (repo root, carry [".bundle", "dist"]): the new token's write inside the default step
# where gluon_share_rule takes the open share (32 and 64 requests): the layer-norm scope (one program
# per request computes s_t over every head's key) against per-head scales, and the share variant
# with early loads (dnp_r128fslwnkex) against the default's (dnp_r128fslwnkx); INT2 and INT4.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benches/kernels/write_share.py --variants ${VARIANTS:-dnp_r128fslwnk,dnp_r128fslwnk+dnp_r128fslwnkex} \
  --shapes ${SHAPES:-64x4096,32x8192} --bits 2,4 --scale-cols ${COLS:-1,8} --repeats 2 --out "$OUT/write_share.json" > "$OUT/write_share.log" 2>&1
grep RESULT "$OUT/write_share.log"; tail -3 "$OUT/write_share.log"
