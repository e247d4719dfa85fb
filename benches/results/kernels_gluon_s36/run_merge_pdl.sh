#!/usr/bin/env bash
# Session 36, device call A (repo root, carry [".bundle", "dist"]): the separate merge launch as a
# programmatic dependent of the stage 1 (_DecodeTuning.merge_pdl): the Triton decode's GPU test file
# (the new merge_pdl tests, the launcher's default taking it) and the Gluon routing test, then the
# whole step with and without it side by side (tuning_ab.py) where the merge is a launch of its own
# (1-16 requests at 8 KV heads; single requests also one token into their last page, 1921 / 8065), the
# paper's format at INT2 and INT4, the server's INT2 format.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout ${TEST_TIMEOUT:-150} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=140 -rfE \
  tests/test_kernels_decode.py \
  "tests/test_kernels_decode_gluon.py::test_the_default_decode_picks_its_gluon_variant_and_split_count_by_waves" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -4 "$OUT/gpu_tests.log"
SHAPES=${SHAPES:-1x1921,1x2048,1x8065,1x8192,1x32768,1x131072,2x65536,4x32768,8x4096,8x32768,16x65536}
timeout ${AB_TIMEOUT:-200} python3 benches/kernels/tuning_ab.py --a merge_pdl=False --b merge_pdl=True --formats group --bits 2,4 \
  --repeats 3 --shapes "$SHAPES" --out "$OUT/ab_group" > "$OUT/ab_group.log" 2>&1
echo "tuning_ab group rc $?"; cat "$OUT/ab_group/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_group.log" | tail -40
timeout ${AB_PAGE_TIMEOUT:-100} python3 benches/kernels/tuning_ab.py --a merge_pdl=False --b merge_pdl=True --formats page --bits 2 \
  --repeats 3 --shapes "${PAGE_SHAPES:-1x2048,1x32768,1x131072,4x32768,8x32768,16x65536}" --out "$OUT/ab_page" > "$OUT/ab_page.log" 2>&1
echo "tuning_ab page rc $?"; cat "$OUT/ab_page/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_page.log" | tail -20
# where a single request's step goes, kernel by kernel (GPU time per kernel, the step's span)
for set in merge_pdl=False merge_pdl=True; do
  timeout 45 python3 benches/kernels/step_kernels.py --shapes 1x1921,1x2048,1x8192,1x32768,1x131072 --bits 2 --set "$set" \
    --out "$OUT/step_kernels_${set#merge_pdl=}.json" > "$OUT/step_kernels_${set#merge_pdl=}.log" 2>&1
  echo "step_kernels $set rc $?"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_${set#merge_pdl=}.log" | cut -c1-160
done
