#!/usr/bin/env bash
# Session 34: every kernels.md column (regenerate.sh; the authors' kernel from .peers/oscar_cuda.so.xz).
set -u
export PYTHONPATH=/tmp/site:$PWD/python
OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} OSCAR_DIRTY=0 REPORT_DIR=$OUT/regen NCU_PROFILE=${NCU_PROFILE:-0} \
  timeout 420 bash benches/kernels/regenerate.sh > "$OUT/regen.log" 2>&1
echo "regen rc $?"; tail -3 "$OUT/regen.log"
grep -A16 "## Targets" "$OUT/regen/kernels.md"
