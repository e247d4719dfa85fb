#!/usr/bin/env bash
# Session 45, call G (repo root, carry [".bundle", "dist", ".peers"], .peers/oscar_cuda.so.xz from call E's
# build): call E's register-cap A/Bs again after the fix to tuning_num_splits (they stopped on the default's
# workspace), then, while REGEN=1, the kernels.md regeneration (run_f.sh) with the time left; everything
# back as call_g.tgz.
set -u
t0=$SECONDS
WAIT_UNTIL=0 bash benches/results/kernels_s45/run_e.sh
if [ "${REGEN:-1}" = 1 ]; then
  REGEN_LIMIT=$((${LIMIT:-590} - (SECONDS - t0))) bash benches/results/kernels_s45/run_f.sh
fi
echo "call G done at $((SECONDS - t0)) s"
# 8 files come back: everything in one archive, and beside it the A/B tables and kernels.md
cd "$OUT" && tar czf call_g.tgz --exclude=oscar_cuda.so.xz --exclude='*.ncu-rep' ./* \
  && { [ -f regen/kernels.md ] && cp regen/kernels.md kernels.md; find . -mindepth 1 -maxdepth 1 ! -name call_g.tgz ! -name 'ab_*.md' ! -name kernels.md -exec rm -rf {} +; ls -la; }
