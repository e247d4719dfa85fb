#!/usr/bin/env bash
# Session 44, call A (repo root, carry [".bundle", "dist", ".peers"]): (0) with AUTHORS=1, the OScaR authors' kernel built in
# the background for call B's regeneration (10 of the 16 cores; left in /tmp/oscar-authors-build and, xz'd, in
# $OUT); (1) the kernel GPU test files whole (Gluon decode, write, decode, kernel path, page grid; extend and
# seal at the end while time is left), which sessions 43 and 42 ran only in part; (2) two A/Bs of long_gluon.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
if [ "${AUTHORS:-0}" = 1 ] && ! ls /tmp/oscar-authors-build/oscar_cuda*.so >/dev/null 2>&1; then
  (MAX_JOBS=${AUTHORS_JOBS:-10} bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build > "$OUT/authors_build.log" 2>&1;
   echo "authors build rc $? at $((SECONDS - t0)) s" >> "$OUT/authors_build.log") &
fi
run() {  # log name, time limit, files...
  local name=$1 limit=$2; shift 2
  OMP_NUM_THREADS=1 timeout "$limit" python3 -m pytest -p no:cacheprovider -p no:benchmark -n ${WORKERS:-6} -q --timeout=200 -rfE \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/$name.log"
}
run gpu_tests_gluon_write_decode 360 tests/test_kernels_decode_gluon.py tests/test_kernels_write.py \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py tests/test_kernels_page_grid.py
# (2) while the authors' build runs on: what the opt-in long_gluon's empty launch costs on this card, against
# the launch at 4 programs per SM (528 on an H200 instead of 1584): does its cost follow the program count?
ab() {  # name, a, b, formats, bits, shapes (left out past STOP_AT s)
  [ $((SECONDS - t0)) -lt ${STOP_AT:-470} ] || { echo "$1 left out at $((SECONDS - t0)) s"; return; }
  timeout ${AB_S:-100} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats "$4" --bits "$5" \
    --repeats 3 --shapes "$6" --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $? at $((SECONDS - t0)) s"; cat "$OUT/$1/ab.md" 2>/dev/null || tail -5 "$OUT/$1.log"
}
ab ab_empty_w12 long_gluon=0 long_gluon=1073741824 group 2 1x2048,1x32768
ab ab_empty_w4 long_gluon=0 long_gluon=1073741824,long_waves=4.0 group 2 1x2048,1x32768
left=$((${WAIT_UNTIL:-585} - (SECONDS - t0) - 10))
[ "$left" -gt 60 ] && run gpu_tests_extend_seal "$left" tests/test_kernels_extend.py tests/test_kernels_seal.py
while [ -n "$(jobs -r)" ] && [ $((SECONDS - t0)) -lt ${WAIT_UNTIL:-585} ]; do sleep 5; done  # the authors' build
echo "left at $((SECONDS - t0)) s"
tail -3 "$OUT/authors_build.log" 2>/dev/null
ls -la "$OUT" | head -30
