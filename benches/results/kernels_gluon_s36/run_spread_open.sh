#!/usr/bin/env bash
# Session 36, prepared for the next device session (NOT run yet; repo root, carry [".bundle", "dist"]): the
# open page's BF16 tiles over the short sealed programs of a single request (_DecodeTuning.spread_open,
# the Triton stage 1): its GPU test, the whole step side by side with the plain launch at 2K-128K tokens
# (paper format INT2 / INT4, the server's INT2 format), and the step kernel by kernel with it.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
cp triton_kernels/*.py "$(python3 -c 'import oscar_sgl.kernels as k, os; print(os.path.dirname(k.__file__))')"/
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=110 -rfE \
  tests/test_kernels_decode.py -k "spread_open or real_sizes or graph" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -3 "$OUT/gpu_tests.log"
for spread in 1 2 4; do
  timeout 150 python3 benches/kernels/tuning_ab.py --a spread_open=0 --b spread_open=$spread --formats group --bits 2,4 --repeats 3 \
    --shapes 1x2048,1x4096,1x8192,1x16384,1x32768,1x131072 --out "$OUT/ab_spread$spread" > "$OUT/ab_spread$spread.log" 2>&1
  echo "spread_open=$spread rc $?"; cat "$OUT/ab_spread$spread/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_spread$spread.log" | tail -12
done
timeout 90 python3 benches/kernels/tuning_ab.py --a spread_open=0 --b spread_open=2 --formats page --bits 2 --repeats 3 \
  --shapes 1x2048,1x8192,1x32768,1x131072 --out "$OUT/ab_spread2_page" > "$OUT/ab_spread2_page.log" 2>&1
echo "page rc $?"; cat "$OUT/ab_spread2_page/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_spread2_page.log" | tail -8
timeout 50 python3 benches/kernels/step_kernels.py --shapes 1x2048,1x8192,1x32768 --bits 2 --set spread_open=2 \
  --out "$OUT/step_kernels_spread2.json" > "$OUT/step_kernels_spread2.log" 2>&1
echo "step_kernels rc $?"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_spread2.log" | cut -c1-160
