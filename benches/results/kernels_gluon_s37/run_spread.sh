#!/usr/bin/env bash
# Session 37, call A (repo root, carry [".bundle", "dist"], dist/ the wheel of this commit): session 36's
# run_spread_open.sh within one 600 s call (a deadline skips what would not fit): the GPU tests of
# spread_open, then the whole single-request step with _DecodeTuning.spread_open = 1 / 2 / 4 side by side
# with 0 (paper format INT2 / INT4, the server's INT2 format), then the step kernel by kernel with 2.
set -u
t0=$SECONDS; left() { echo $((560 - (SECONDS - t0))); }
source benches/results/kernels_gluon_s37/prelude.sh
echo "setup done at $((SECONDS - t0)) s"
[ -n "${SKIP_TESTS:-}" ] || OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=110 -rfE \
  tests/test_kernels_decode.py -k "spread_open or real_sizes or graph" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/gpu_tests.log"
ab() {  # name, seconds wanted, tuning_ab arguments...
  local name=$1 want=$2; shift 2
  [ "$(left)" -gt "$want" ] || { echo "$name: skipped ($(left) s left)"; return; }
  timeout "$want" python3 benches/kernels/tuning_ab.py --agree 2e-3 "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; cat "$OUT/$name/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/$name.log" | tail -12
}
ab ab_spread2 150 --a spread_open=0 --b spread_open=2 --formats group --bits 2,4 --repeats 3 \
  --shapes 1x2048,1x4096,1x8192,1x16384,1x32768,1x131072
ab ab_spread2_page 90 --a spread_open=0 --b spread_open=2 --formats page --bits 2 --repeats 3 \
  --shapes 1x2048,1x8192,1x32768,1x131072
ab ab_spread1 100 --a spread_open=0 --b spread_open=1 --formats group --bits 2 --repeats 3 \
  --shapes 1x2048,1x4096,1x8192,1x16384,1x32768
ab ab_spread4 100 --a spread_open=0 --b spread_open=4 --formats group --bits 2 --repeats 3 \
  --shapes 1x2048,1x4096,1x8192,1x16384,1x32768
if [ "$(left)" -gt 50 ]; then
  timeout 50 python3 benches/kernels/step_kernels.py --shapes 1x2048,1x8192,1x32768 --bits 2 --set spread_open=2 \
    --out "$OUT/step_kernels_spread2.json" > "$OUT/step_kernels_spread2.log" 2>&1
  echo "step_kernels rc $?"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_spread2.log" | cut -c1-160
fi
echo "done at $((SECONDS - t0)) s"
