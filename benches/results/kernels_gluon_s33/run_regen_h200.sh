#!/usr/bin/env bash
# Session 33, device call E (fresh machine, carry [".bundle", "dist", ".peers"]): every kernels.md
# column on an H200 only (exits at once on another card). The authors' kernel is the .so an earlier
# call on the same image built (.peers/oscar_cuda.so.xz, benches/peers/build_oscar_authors.sh), so
# the ~8 min build is skipped.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 9;; esac
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
mkdir -p /tmp/oscar-authors-build && xz -dc .peers/oscar_cuda.so.xz > /tmp/oscar-authors-build/oscar_cuda.so
echo rc=0 > /tmp/authors_done; echo "authors .so unpacked from .peers/oscar_cuda.so.xz" > /tmp/authors_build.log
bash benches/results/kernels_gluon_s33/run_regen.sh
