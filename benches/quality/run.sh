#!/usr/bin/env bash
# The full quality table of benches/results/quality.md: SmolLM2-135M-Instruct, both bit widths,
# all four methods, prefix 1024 + 1024 scored tokens, on several public-domain texts.
# Usage: bash benches/quality/run.sh [EVAL_DATA_DIR]   (default ../shared/eval-data)
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/eval-data}
VENV=${OSCAR_VENV:-.venv}
mkdir -p benches/results
for t in austen_emma austen_persuasion devils_dictionary; do
  "$VENV/bin/python" -m oscar_sgl eval ppl --text "$DATA/$t.txt" --bits 2 4 \
      --methods oscar kivi rotation-only scaling-only --prefix-tokens 1024 --score-tokens 1024 \
      --json "benches/results/quality_$t.json" --no-progress --threads 2 | tee "benches/results/quality_$t.txt"
done
