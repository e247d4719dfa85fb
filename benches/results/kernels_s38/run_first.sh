#!/usr/bin/env bash
# Session 38's first device call (repo root, carry [".bundle", "dist", ".peers"]): on an H200, every
# kernels.md column with this tree's defaults (SPREAD_OPEN included; run_regen.sh of session 37, whose
# result replaces benches/results/kernels.md); on any other card, run_a.sh (the GPU tests with the
# new default, merge_one_pass timed). The second call runs the other one where time is left.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} bash benches/results/kernels_gluon_s37/run_regen.sh
else
  bash benches/results/kernels_s38/run_a.sh
fi
