#!/usr/bin/env bash
# Session 39's device call (repo root, carry [".bundle", "dist", ".peers"]; one command of at most 600 s):
# every kernels.md column with this tree's defaults (session 37's run_regen.sh, Nsight Compute included),
# then, where the regeneration ended before TESTS_BEFORE s (430), the GPU tests with SPREAD_OPEN the launcher's default
# (run_tests_default.sh: pytest bounded at 100 s). $OUT is packed into one out.tar.xz at the end (the
# device returns at most 8 files).
t0=$SECONDS
REGEN_LIMIT=${REGEN_LIMIT:-565} OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} bash benches/results/kernels_gluon_s37/run_regen.sh
echo "regeneration done at $((SECONDS - t0)) s"
if [ $((SECONDS - t0)) -lt ${TESTS_BEFORE:-430} ]; then
  bash benches/results/kernels_gluon_s37/run_tests_default.sh
else
  echo "tests left out: $((SECONDS - t0)) s spent"
fi
(cd "$OUT" && tar cJf /tmp/out.tar.xz . && find . -mindepth 1 -delete && mv /tmp/out.tar.xz . && ls -la)
