#!/usr/bin/env bash
# Session 42, call C (repo root, carry [".bundle", "dist"]): the butterflies' lane form as variants of their
# own (GluonVariant.lane_fwht, suffix h) and the launcher's rule (from GLUON_LANE_FWHT_PAIRS = 128 pairs):
# (1) their GPU tests (bit-identity with the plain forms, the write against the Triton step, the default's
# routing and split counts); (2) the plain form against the lane form of the launcher's variant at each shape
# (tuning_ab gluon_variant=-h / +h), both formats, INT2 and INT4, 8-128 requests at 8 KV heads.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
OMP_NUM_THREADS=1 timeout ${TESTS_S:-150} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -q --timeout=120 -rfE \
  tests/test_kernels_decode_gluon.py tests/test_sglang_kernel_path.py \
  -k "lane or kvh or kxvh or pvh or pxvh or picks_its_gluon_variant or takes_the_gluon_step or default_decode_runs or (test_sglang_kernel_path and graph and not cpu)" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests.log"
for fmt in group page; do
  if [ $fmt = group ]; then shapes=8x32768,16x65536,32x8192,64x4096,96x4096,128x2048; else shapes=16x65536,32x8192,64x4096,128x2048; fi
  timeout ${AB_S:-170} python3 benches/kernels/tuning_ab.py --a gluon_variant=-h --b gluon_variant=+h --agree 1e-5 \
    --formats $fmt --bits 2,4 --repeats 3 --shapes $shapes --out "$OUT/ab_lanes_$fmt" > "$OUT/ab_lanes_$fmt.log" 2>&1
  echo "ab $fmt rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_lanes_$fmt/ab.md" 2>/dev/null || tail -5 "$OUT/ab_lanes_$fmt.log"
done
