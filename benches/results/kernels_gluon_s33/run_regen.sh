#!/usr/bin/env bash
# Session 33, device call C (same machine as A): wait for the authors' build, then every kernels.md
# column (regenerate.sh), then 2-3 requests short to long on this card (the new 16-pair range).
set -u
export PYTHONPATH=/tmp/site:$PWD/python
for i in $(seq 1 100); do [ -f /tmp/authors_done ] && break; sleep 3; done
cat /tmp/authors_done 2>/dev/null || { echo "authors build not done"; tail -5 /tmp/authors_build.log; }
cp /tmp/authors_build.log "$OUT/" 2>/dev/null
OSCAR_COMMIT=${OSCAR_COMMIT:-unknown} OSCAR_DIRTY=0 REPORT_DIR=$OUT/regen timeout 380 bash benches/kernels/regenerate.sh > "$OUT/regen.log" 2>&1
echo "regen rc $?"; tail -3 "$OUT/regen.log"
grep -A16 "## Targets" "$OUT/regen/kernels.md"
