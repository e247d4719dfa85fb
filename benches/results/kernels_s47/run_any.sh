#!/usr/bin/env bash
# Session 47 (repo root, carry [".bundle", "dist", ".peers"]): on an H200 the kernels.md regeneration at OSCAR_COMMIT
# (session 45's run_i.sh, ~6 min); on any other card call B (run_b.sh).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) LIMIT=${LIMIT:-560} bash benches/results/kernels_s45/run_i.sh ;;
  *) bash benches/results/kernels_s47/run_b.sh ;;
esac
