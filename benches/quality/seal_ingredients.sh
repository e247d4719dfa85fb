#!/usr/bin/env bash
# The seal-time quantizer options of docs/OSCAR.md §2.3 (issue 15, session 10), at INT2 on the three
# texts and windows of run.sh (SmolLM2-135M-Instruct, 4 windows of 1024 prefix + 512 scored tokens).
# Default set: oscar and kivi, each with offset integer / min and clip none / values (8 configs and
# the full-precision baseline in one command per text, so every pair is compared on the same
# windows); results in benches/results/quality_seal_<text>.{txt,json}.
# SEAL_SET=keys: oscar with offset integer / min and clip keys / both (the key clip search), in
# benches/results/quality_seal_keys_<text>.{txt,json}.
# benches/quality/seal_report.py pools them (paired over all 12 windows against today's oscar).
# The paper's key-range format (G_K = G_V = 32, fp16 pairs), the default when these were measured.
# Usage: [SEAL_SET=keys] bash benches/quality/seal_ingredients.sh [EVAL_DATA_DIR] [TEXT...]
#   (default ../shared/eval-data; texts austen_emma austen_persuasion devils_dictionary)
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/eval-data}
shift || true
VENV=${OSCAR_VENV:-.venv}
if [ "${SEAL_SET:-values}" = keys ]; then
  tag=quality_seal_keys_ methods=(oscar) clips=(keys both)
else
  tag=quality_seal_ methods=(oscar kivi) clips=(none values)
fi
texts=("$@")
[ ${#texts[@]} -gt 0 ] || texts=(austen_emma austen_persuasion devils_dictionary)
mkdir -p benches/results
for text in "${texts[@]}"; do
  OMP_NUM_THREADS=1 "$VENV/bin/python" -m oscar_sgl eval ppl --text "$DATA/$text.txt" --windows 4 \
      --prefix-tokens 1024 --score-tokens 512 --bits 2 --methods "${methods[@]}" --offset integer min \
      --k-group 32 --v-group 32 --key-ranges group \
      --clip "${clips[@]}" --json "benches/results/$tag$text.json" --no-progress --threads 1 \
      | tee "benches/results/$tag$text.txt"
done
