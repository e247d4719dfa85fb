#!/usr/bin/env bash
# Session 38's device calls (repo root, carry [".bundle", "dist", ".peers"]): on an H200, every
# kernels.md column with this tree's defaults (SPREAD_OPEN included; run_regen.sh of session 37, whose
# result replaces benches/results/kernels.md), then the GPU tests with the new default; on any other card, run_a.sh (the GPU tests with the
# new default, merge_one_pass timed). ONLY=regen or ONLY=a picks one whatever the card; NO_TESTS=1 leaves the tests out after the regeneration. What $OUT holds
# is packed into one out.tar.xz at the end (the device returns at most 8 files).
what=${ONLY:-}
if [ -z "$what" ]; then
  what=a; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && what=regen
fi
if [ "$what" = regen ]; then
  OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} bash benches/results/kernels_gluon_s37/run_regen.sh
  [ -z "${ONLY:-}" ] && [ -z "${NO_TESTS:-}" ] && bash benches/results/kernels_gluon_s37/run_tests_default.sh  # ~2 min; the regeneration took ~7 on an H100
else
  bash benches/results/kernels_s38/run_a.sh
fi
(cd "$OUT" && tar cJf /tmp/out.tar.xz . && find . -mindepth 1 -delete && mv /tmp/out.tar.xz . && ls -la)
