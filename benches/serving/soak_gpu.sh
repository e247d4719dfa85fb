#!/usr/bin/env bash
# The server soak (issue 16 item 1) against an H200 `--kv-cache oscar` server launched as
# benches/serving/bench.py launches its servers (Llama-3.1-8B shape, dummy weights, no tokenizer:
# token ids only, decode CUDA graphs on), with a 32768-token pool of 128-token pages and 32 running
# requests. One command on the device machine, at most ~5 min (setup ~1 min on a fresh machine,
# server start ~1.5 min, soak SOAK_MINUTES=1.5, checks and control conversations):
#
#   bash benches/serving/soak_gpu.sh          # device tool, carry .bundle and dist (as run_gpu.sh setup)
#
# Writes $OUT/soak-gpu.json (figures; `problems` empty when every check passed), $OUT/soak-gpu.log
# (the server log, trimmed) and $OUT/setup.log. Exit status: 0 passed, 1 a check failed, 3 setup
# failed, 124 over the time limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-soak-gpu}
mkdir -p "$OUT"
t0=$(date +%s)
OUT="$OUT" bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1
if ! grep -q "^=== setup: rc 0" "$OUT/setup.log"; then tail -20 "$OUT/setup.log"; exit 3; fi
echo "setup: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout -s TERM $(( 290 - ($(date +%s) - t0) )) python3 benches/serving/soak.py --gpu \
  --model /tmp/llama-3.1-8b-config --minutes "${SOAK_MINUTES:-1.5}" --out "$OUT"
rc=$?
f="$OUT/soak-gpu.log"
[ -f "$f" ] && [ "$(wc -c < "$f")" -gt 400000 ] && { head -c 150000 "$f"; echo; echo "[... trimmed ...]"; tail -c 200000 "$f"; } > "$f.t" && mv "$f.t" "$f"
rm -f "$OUT/soak-server.log"  # the same log, untrimmed (soak-gpu.log is its copy)
echo "soak_gpu: rc $rc, $(( $(date +%s) - t0 )) s"
exit $rc
