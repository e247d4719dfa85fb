#!/usr/bin/env bash
# Session 49 (repo root, carry [".bundle", "dist", ".peers"]): on an H200 the kernels.md regeneration at OSCAR_COMMIT
# (session 45's run_i.sh, ~6 min; call E right after in a call of its own); on any other card call E (run_e.sh),
# then session 48's call C where time is left.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) LIMIT=${LIMIT:-560} bash benches/results/kernels_s45/run_i.sh ;;
  *) bash benches/results/kernels_s49/run_e.sh ;;
esac
