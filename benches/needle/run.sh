#!/usr/bin/env bash
# The full passkey-retrieval run through OscarCache (benches/results/needle.md): SmolLM2-135M-Instruct,
# 1K-8K tokens, 3 depths x 2 trials per length, full precision and INT2/INT4 oscar and kivi.
# In the paper's format (oscar_sgl.config.PAPER_FORMAT), the default when needle.md was measured; flags
# given to this script come last and win (e.g. the INT2 default of today, INT2_FORMAT: --key-ranges page
# --k-group 16 --v-group 64 --offset min --clip values).
set -euo pipefail
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 .venv/bin/oscar-sgl eval needle --lengths 1024 2048 4096 8192 --depths 0.1 0.5 0.9 --trials 2 \
  --bits 2 4 --methods oscar kivi --prefill context --threads 1 \
  --k-group 32 --v-group 32 --key-ranges group --offset integer --clip none \
  --json benches/results/needle.json --png benches/results/needle.png "$@"
