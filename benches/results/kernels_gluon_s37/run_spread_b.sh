#!/usr/bin/env bash
# Session 37, call D (repo root, carry [".bundle", "dist", ".peers"]): spread_open=2 against 0 again after
# the short-request test moved ahead of the last page's staging lookup (the sealed programs of a long
# request no longer wait on two dependent loads at their start), and its GPU tests.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
for f in group page; do
  bits=2,4; [ $f = page ] && bits=2
  timeout 120 python3 benches/kernels/tuning_ab.py --agree 2e-3 --a spread_open=0 --b spread_open=2 --formats $f --bits $bits \
    --repeats 5 --shapes 1x2048,1x8192,1x32768,1x131072 --out "$OUT/ab_$f" > "$OUT/ab_$f.log" 2>&1
  echo "$f rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_$f/ab.md" 2>/dev/null || tail -5 "$OUT/ab_$f.log"
done
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=110 -rfE \
  tests/test_kernels_decode.py -k "spread_open or real_sizes or graph" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/gpu_tests.log"
