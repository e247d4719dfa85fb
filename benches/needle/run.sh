#!/usr/bin/env bash
# The full passkey-retrieval run through OscarCache (benches/results/needle.md): SmolLM2-135M-Instruct,
# 1K-8K tokens, 3 depths x 2 trials per length, full precision and INT2/INT4 oscar and kivi.
set -euo pipefail
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 .venv/bin/oscar-sgl eval needle --lengths 1024 2048 4096 8192 --depths 0.1 0.5 0.9 --trials 2 \
  --bits 2 4 --methods oscar kivi --prefill context --threads 1 \
  --json benches/results/needle.json --png benches/results/needle.png "$@"
