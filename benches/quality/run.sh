#!/usr/bin/env bash
# The quality tables of benches/results/quality.md: SmolLM2-135M-Instruct, 4 non-overlapping windows
# of 1024 prefix + 512 scored tokens spread over each of three public-domain texts (one model load per
# command); INT2 with all four methods, INT4 with oscar and kivi (the INT4 ablations sat within 1.4 %
# of full precision in the single-window run). Means, 95 % Student t intervals and paired differences
# over the windows: `oscar-sgl eval ppl --windows`.
# Usage: bash benches/quality/run.sh [EVAL_DATA_DIR]   (default ../shared/eval-data)
# WINDOWS, PREFIX, SCORE and THREADS override 4, 1024, 512 and 2 (the run recorded in quality.md took
# about 80 min on a 2-core box shared with other jobs).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/eval-data}
VENV=${OSCAR_VENV:-.venv}
W=${WINDOWS:-4} P=${PREFIX:-1024} S=${SCORE:-512} T=${THREADS:-2}
mkdir -p benches/results
for t in austen_emma austen_persuasion devils_dictionary; do
  for spec in "2:oscar kivi rotation-only scaling-only" "4:oscar kivi"; do
    bits=${spec%%:*}
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m oscar_sgl eval ppl --text "$DATA/$t.txt" --bits "$bits" --methods ${spec#*:} \
        --windows "$W" --prefix-tokens "$P" --score-tokens "$S" \
        --json "benches/results/quality_${t}_int$bits.json" --no-progress --threads "$T" \
        | tee "benches/results/quality_${t}_int$bits.txt"
  done
done
