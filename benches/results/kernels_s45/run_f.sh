#!/usr/bin/env bash
# Session 45, call F (right after call E on the same held machine; carry [".bundle", "dist", ".peers"]): every
# kernels.md column with this tree's defaults (session 37's run_regen.sh: regenerate.sh with the Nsight
# Compute section), the authors' kernel from call E's build (or .peers/oscar_cuda.so.xz) in /tmp/oscar-authors-build. OSCAR_COMMIT names
# the commit (the device's tree has no git).
t0=$SECONDS
REGEN_LIMIT=${REGEN_LIMIT:-585} OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} bash benches/results/kernels_gluon_s37/run_regen.sh
echo "regeneration done at $((SECONDS - t0)) s"
