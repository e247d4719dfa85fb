#!/usr/bin/env bash
# Session 43, call A (repo root, carry [".bundle", "dist", ".peers"]): a single request's long contexts on a
# Gluon stage 1 of their own (_DecodeTuning.long_gluon: the Triton stage 1 keeps the requests shorter than
# the threshold, a Gluon launch at 12 programs per SM, its programmatic dependent, takes the others; one
# merge over both split counts). (0) with NO_AUTHORS=0, the OScaR authors' kernel built in the background for
# call B's regeneration (10 of the 16 cores; the .so is left in $OUT and in /tmp/oscar-authors-build); (1) the GPU
# tests of the new path (against each launch alone, one CUDA graph across the threshold) and the routing and
# graph tests around it; (2) whole steps side by side, the launcher's tuning with long_gluon=0 (the Triton
# stage 1 alone) against long_gluon=1 (every length on the Gluon launch) and against long_gluon=2^30 (the
# Gluon launch empty: what the dual step costs where it does not take a request); the lane form against the
# plain one, the register-prefetch variant (168 registers), the merge as a dependent launch, 15.5 programs per SM.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
if [ "${NO_AUTHORS:-1}" != 1 ] && ! ls /tmp/oscar-authors-build/oscar_cuda*.so >/dev/null 2>&1; then
  (MAX_JOBS=${AUTHORS_JOBS:-10} bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build > "$OUT/authors_build.log" 2>&1;
   echo "authors build rc $? at $((SECONDS - t0)) s" >> "$OUT/authors_build.log") &
fi
OMP_NUM_THREADS=1 timeout ${TESTS_S:-150} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 4 -q --timeout=150 -rfE \
  tests/test_kernels_decode_gluon.py tests/test_kernels_decode.py tests/test_sglang_kernel_path.py \
  -k "long_gluon or long_requests or single_requests_hand or takes_the_gluon_step or default_decode_runs or (graph and not cpu) or real_sizes" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests.log"
ab() {  # name, a, b, formats, bits, shapes (left out once the call has run STOP_AT s)
  [ $((SECONDS - t0)) -lt ${STOP_AT:-330} ] || { echo "$1 left out at $((SECONDS - t0)) s"; return; }
  timeout ${AB_S:-150} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats "$4" --bits "$5" \
    --repeats 3 --shapes "$6" --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $? at $((SECONDS - t0)) s"; cat "$OUT/$1/ab.md" 2>/dev/null || tail -5 "$OUT/$1.log"
}
ab ab_long_group long_gluon=0 long_gluon=1 group 2,4 1x32768,1x65536,1x131072
ab ab_empty long_gluon=0 long_gluon=1073741824 group,page 2 1x2048,1x8192
ab ab_long_page long_gluon=0 long_gluon=1 page 2,4 1x65536,1x131072
ab ab_long_group2 long_gluon=0 long_gluon=1 group 2,4 1x49152,1x98304
ab ab_forms long_gluon=1 "long_gluon=1,long_variant='dnp_r128fslwnkv'" group 2,4 1x131072
ab ab_pdl long_gluon=1 long_gluon=1,merge_pdl=True group 2 1x65536,1x131072
ab ab_rp long_gluon=1 "long_gluon=1,long_variant='rp_r168fslwnk'" group 2 1x65536,1x131072
ab ab_waves long_gluon=1 long_gluon=1,long_waves=15.5 group 2 1x65536,1x131072
while [ -n "$(jobs -r)" ] && [ $((SECONDS - t0)) -lt ${WAIT_UNTIL:-585} ]; do sleep 5; done  # the authors' build
echo "left at $((SECONDS - t0)) s"
tail -3 "$OUT/authors_build.log" 2>/dev/null
ls -la "$OUT" | head -30
