#!/usr/bin/env bash
# Session 35, device call B (repo root, carry [".bundle", "dist"]): the launcher's split-write rule
# (GLUON_SPLIT_WRITE_PAIRS / _BITS) under its GPU tests (routing, split forms), then write_share.py
# at INT2 over more batch sizes (128-1024 pairs), both formats, one repeat.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -p no:cacheprovider -p no:benchmark -q --timeout=190 -rfE \
  tests/test_kernels_decode_gluon.py -k "split_write or picks_its_gluon_variant or takes_the_gluon_step or launch_tuning" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -4 "$OUT/gpu_tests.log"
timeout ${SPLIT_TIMEOUT:-240} python3 benches/kernels/write_share.py --formats group,page --bits 2 --repeats 1 --budget 12e9 \
  --shapes 16x16384,24x8192,40x4096,48x4096,96x2048,128x2048 --out "$OUT/split_rule.json" > "$OUT/split_rule.log" 2>&1
echo "write_share rc $?"; grep -E "RESULT|FAILED" "$OUT/split_rule.log" | sed 's/write compiled in but storing nothing/skip/' | cut -c1-260
