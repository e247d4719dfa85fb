#!/usr/bin/env bash
# The main job on the embedded default: set up, then the quality report of OScaR vs KIVI and the
# ablations on SmolLM2-135M-Instruct (CPU), with the JSON written to out/quality.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${OSCAR_VENV:-.venv}
mkdir -p out
"$VENV/bin/oscar-sgl" eval ppl --bits 2 4 --methods oscar kivi rotation-only scaling-only \
    --prefix-tokens 1024 --score-tokens 1024 --json out/quality.json "$@"
