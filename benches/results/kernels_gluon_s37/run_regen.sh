#!/usr/bin/env bash
# Session 37, call B (right after call A on the same held machine, or on a fresh one; carry [".bundle",
# "dist", ".peers"]): every kernels.md column on the card that comes (kernels.md is the H200's; an H100's
# report stays in this folder), with the launcher's defaults of this commit,
# and the Nsight Compute section (regenerate.sh with NCU_PROFILE=1); the working tree's kernels are
# copied over the installed wheel's first. OSCAR_COMMIT names the commit (the device's tree has no git).
set -u
t0=$SECONDS
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
source benches/results/kernels_gluon_s37/prelude.sh
OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} OSCAR_DIRTY=0 REPORT_DIR=$OUT/regen NCU_PROFILE=${NCU_PROFILE:-1} \
  timeout $((${REGEN_LIMIT:-585} - (SECONDS - t0))) bash benches/kernels/regenerate.sh > "$OUT/regen.log" 2>&1
echo "regen rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/regen.log"
grep -A16 "## Targets" "$OUT/regen/kernels.md"
