#!/usr/bin/env bash
# Session 36, device call B (repo root, carry [".bundle", "dist"]): after call A (run_merge_pdl.sh) found the
# merge as a programmatic dependent slower with the Triton stage 1 of single requests: the launcher's rule
# now takes it with the Gluon stage 1 only. The working tree's kernels over the installed wheel's (the wheel
# in dist/ may be older), the GPU tests again, the paper format's A/B at INT2 and INT4 where the Gluon step
# has a separate merge (2-16 requests), and single requests kernel by kernel, also one token into their
# last page (1921, 8065: bench_decode's setup now takes lengths that are not whole pages); single
# requests with the merge triggered after the programs' stores (merge_pdl_late).
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
cp triton_kernels/*.py "$(python3 -c 'import oscar_sgl.kernels as k, os; print(os.path.dirname(k.__file__))')"/
nvidia-smi --query-gpu=name --format=csv,noheader
OMP_NUM_THREADS=1 timeout ${TEST_TIMEOUT:-120} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q --timeout=110 -rfE \
  tests/test_kernels_decode.py -k "merge_pdl or dependent or graph or default or real_sizes" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -3 "$OUT/gpu_tests.log"
timeout ${AB_TIMEOUT:-150} python3 benches/kernels/tuning_ab.py --a merge_pdl=False --b merge_pdl=True --formats group --bits 2,4 \
  --repeats 3 --shapes "${SHAPES:-2x65536,4x32768,8x4096,8x32768,16x65536}" --out "$OUT/ab_group" > "$OUT/ab_group.log" 2>&1
echo "tuning_ab group rc $?"; cat "$OUT/ab_group/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_group.log" | tail -40
timeout 50 python3 benches/kernels/step_kernels.py --shapes 1x1921,1x2048,1x8065,1x8192,1x32768,1x131072 --bits 2 \
  --out "$OUT/step_kernels_single.json" > "$OUT/step_kernels_single.log" 2>&1
echo "step_kernels rc $?"; grep -E "KERNELS|SPAN|Error" "$OUT/step_kernels_single.log" | cut -c1-160
# single requests (the Triton stage 1, 128 splits): the merge's trigger after each program's partial
# stores (merge_pdl_late) instead of at its start, against the plain merge launch. merge_pdl_late was
# removed after this measurement (no gain); this A/B runs on commit b778035, where it exists.
timeout ${AB1_TIMEOUT:-90} python3 benches/kernels/tuning_ab.py --a merge_pdl=False --b merge_pdl=True,merge_pdl_late=True \
  --formats group --bits 2 --repeats 3 --shapes 1x2048,1x32768,1x131072 --out "$OUT/ab_single_late" > "$OUT/ab_single_late.log" 2>&1
echo "tuning_ab single late rc $?"; cat "$OUT/ab_single_late/ab.md" 2>/dev/null || grep -E "RESULT|Error" "$OUT/ab_single_late.log" | tail -10
