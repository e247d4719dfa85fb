#!/usr/bin/env bash
# Session 45, call G (repo root, carry [".bundle", "dist", ".peers"], .peers/oscar_cuda.so.xz from call E's
# build): call E's register-cap A/Bs again after the fix to tuning_num_splits (they stopped on the default's
# workspace), then, while REGEN=1, the kernels.md regeneration (run_f.sh) with the time left.
set -u
t0=$SECONDS
WAIT_UNTIL=0 bash benches/results/kernels_s45/run_e.sh
if [ "${REGEN:-1}" = 1 ]; then
  REGEN_LIMIT=$((${LIMIT:-590} - (SECONDS - t0))) bash benches/results/kernels_s45/run_f.sh
fi
echo "call G done at $((SECONDS - t0)) s"
