#!/usr/bin/env bash
# Session 37, prepared for the next device session (NOT run; repo root, carry [".bundle", "dist", ".peers"]):
# the separate merge launch in one pass (_DecodeTuning.merge_one_pass: all log-sum-exps in one load, then
# the non-empty splits' rows in one more) against the chunked merge: its GPU tests, then whole steps side
# by side, single requests (the Triton stage 1, 129 partials, SPREAD_OPEN on in both arms) and 2-16
# requests (the Gluon stage 1's separate merge, 17-129 partials), paper format INT2 / INT4 and the
# server's INT2 format; then a single request's step kernel by kernel with it.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=90 -rfE \
  tests/test_kernels_decode.py -k "one_pass or spread or graph" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/gpu_tests.log"
for f in group page; do
  bits=2,4; [ $f = page ] && bits=2
  timeout 150 python3 benches/kernels/tuning_ab.py --agree 1e-3 --a merge_one_pass=False --b merge_one_pass=True --formats $f \
    --bits $bits --repeats 5 --shapes 1x2048,1x8192,1x32768,1x131072,2x65536,4x32768,8x32768,16x65536 \
    --out "$OUT/ab_$f" > "$OUT/ab_$f.log" 2>&1
  echo "$f rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_$f/ab.md" 2>/dev/null || tail -5 "$OUT/ab_$f.log"
done
timeout 60 python3 benches/kernels/step_kernels.py --shapes 1x2048,1x32768,1x131072 --bits 2 --set merge_one_pass=True \
  --out "$OUT/step_kernels_one_pass.json" > "$OUT/step_kernels_one_pass.log" 2>&1
echo "step_kernels rc $?"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_one_pass.log" | cut -c1-160
