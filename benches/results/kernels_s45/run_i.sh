#!/usr/bin/env bash
# Session 45, call I (repo root, carry [".bundle", "dist", ".peers"], .peers/oscar_cuda.so.xz): kernels.md is the
# H200's, so on any other card this call stops at once; on an H200, the regeneration (run_f.sh), everything back
# as call_i.tgz and kernels.md beside it.
set -u
t0=$SECONDS
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) ;; *) echo "not an H200 ($name): no regeneration"; exit 0;; esac
REGEN_LIMIT=$((${LIMIT:-585} - (SECONDS - t0))) bash benches/results/kernels_s45/run_f.sh
cd "$OUT" && tar czf call_i.tgz --exclude=oscar_cuda.so.xz --exclude='*.ncu-rep' ./* \
  && { [ -f regen/kernels.md ] && cp regen/kernels.md kernels.md; find . -mindepth 1 -maxdepth 1 ! -name call_i.tgz ! -name kernels.md -exec rm -rf {} +; ls -la; }
echo "call I done at $((SECONDS - t0)) s"
