#!/usr/bin/env bash
# Session 48 (repo root, carry [".bundle", "dist", ".peers"]): on an H200 the kernels.md regeneration at OSCAR_COMMIT
# (session 45's run_i.sh, ~6 min; call C right after in a call of its own); on any other card call C (run_c.sh).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) LIMIT=${LIMIT:-560} bash benches/results/kernels_s45/run_i.sh ;;
  *) bash benches/results/kernels_s48/run_c.sh ;;
esac
