#!/usr/bin/env bash
# Session 34 (repo root, carry [".bundle", "dist", ".peers"]; after run_tiles64.sh on the same machine or
# on a fresh one): every kernels.md column on an H200 only (exits at once on another card). The
# authors' kernel is the .so an earlier build on the same machine image made (.peers/oscar_cuda.so.xz),
# which regenerate.sh unpacks and uses where it loads, so the ~8 min build is skipped.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 9;; esac
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
bash benches/results/kernels_gluon_s34/run_regen.sh
