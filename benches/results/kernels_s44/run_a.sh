#!/usr/bin/env bash
# Session 44, call A (repo root, carry [".bundle", "dist", ".peers"]): (0) the OScaR authors' kernel built in
# the background for call B's regeneration (10 of the 16 cores; left in /tmp/oscar-authors-build and, xz'd, in
# $OUT); (1) the kernel GPU test files whole (Gluon decode, write, decode, kernel path; then extend, page grid,
# seal while time is left), which sessions 43 and 42 ran only in part.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
if ! ls /tmp/oscar-authors-build/oscar_cuda*.so >/dev/null 2>&1; then
  (MAX_JOBS=${AUTHORS_JOBS:-10} bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build > "$OUT/authors_build.log" 2>&1;
   echo "authors build rc $? at $((SECONDS - t0)) s" >> "$OUT/authors_build.log") &
fi
run() {  # log name, time limit, files...
  local name=$1 limit=$2; shift 2
  OMP_NUM_THREADS=1 timeout "$limit" python3 -m pytest -p no:cacheprovider -p no:benchmark -n ${WORKERS:-6} -q --timeout=200 -rfE \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/$name.log"
}
run gpu_tests_gluon_write_decode 330 tests/test_kernels_decode_gluon.py tests/test_kernels_write.py \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py
left=$((${WAIT_UNTIL:-585} - (SECONDS - t0) - 10))
[ "$left" -gt 60 ] && run gpu_tests_extend_page_seal "$left" tests/test_kernels_extend.py tests/test_kernels_page_grid.py \
  tests/test_kernels_seal.py
while [ -n "$(jobs -r)" ] && [ $((SECONDS - t0)) -lt ${WAIT_UNTIL:-585} ]; do sleep 5; done  # the authors' build
echo "left at $((SECONDS - t0)) s"
tail -3 "$OUT/authors_build.log" 2>/dev/null
ls -la "$OUT" | head -30
