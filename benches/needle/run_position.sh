#!/usr/bin/env bash
# Passkey retrieval with the server's default prefill (every prompt token reads the pages below its
# own as codes), INT2 oscar and kivi through OscarCache, 1K and 2K (benches/results/needle.md).
# In the paper's format (oscar_sgl.config.PAPER_FORMAT), the default when needle.md was measured; flags
# given to this script come last and win (e.g. the INT2 default of today, INT2_FORMAT: --key-ranges page
# --k-group 16 --v-group 64 --offset min --clip values).
set -euo pipefail
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 .venv/bin/oscar-sgl eval needle --lengths 1024 2048 --depths 0.1 0.5 0.9 --trials 1 \
  --bits 2 --methods oscar kivi --prefill position --threads 1 \
  --k-group 32 --v-group 32 --key-ranges group --offset integer --clip none \
  --json benches/results/needle_position.json --png benches/results/needle_position.png "$@"
