#!/usr/bin/env bash
# Session 35, device call A (repo root, carry [".bundle", "dist", ".peers"]): the authors' kernel built
# in the background (its .so comes back as oscar_cuda.so.xz for .peers/, so regenerate.sh skips the
# build on a later machine); the split-write GPU tests; then write_share.py: the default step against
# the same step with the write as a launch of its own (split_write; with the query rotation in it:
# split_rotation; the stage 1 a programmatic dependent launch: split_pdl), without the write, and
# storing nothing; both formats, INT2 and INT4, two interleaved repeats.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
(OUT=$OUT bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build > "$OUT/authors_build.log" 2>&1; echo "authors build rc $?" >> "$OUT/authors_build.log") &
bpid=$!
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -q --timeout=140 -rfE \
  tests/test_kernels_decode_gluon.py -k "split_write" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $?"; tail -4 "$OUT/gpu_tests.log"
timeout ${SPLIT_TIMEOUT:-330} python3 benches/kernels/write_share.py --formats group,page --bits 2,4 --repeats 2 --budget 12e9 \
  --shapes 64x4096,32x8192,8x32768,16x65536 --out "$OUT/split_write.json" > "$OUT/split_write.log" 2>&1
echo "write_share rc $?"; grep -E "RESULT|FAILED" "$OUT/split_write.log" | sed 's/ (ran [^)]*)//; s/write compiled in but storing nothing/skip/' | cut -c1-230
wait $bpid; tail -2 "$OUT/authors_build.log"; ls -la "$OUT"
