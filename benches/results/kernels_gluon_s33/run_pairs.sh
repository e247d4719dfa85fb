#!/usr/bin/env bash
# Session 33, second device call (repo root, carry [".bundle", "dist"]): 16 and 24 (request, KV head)
# pairs (2 and 3 requests at 8 KV heads), where the default ran the Triton stage 1, against the Gluon
# default variants at the launcher's split count (what the default runs once its pair range starts at
# 16: the open share at 16 pairs by gluon_share_rule, the plain variant at 24), short to long contexts.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
S=2x1024,2x2048,2x4096,2x16384,2x32768,2x131072,3x1024,3x4096,3x8192,3x65536
timeout 200 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-variants dnp_r128fslwnk,dnp_r128fslwnkx \
  --shapes $S --out "$OUT" > "$OUT/bench_pairs_group.log" 2>&1
mv "$OUT/gluon.md" "$OUT/pairs_group.md"; mv "$OUT/gluon.json" "$OUT/pairs_group.json"
timeout 200 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-format page --gluon-block-n 32 \
  --gluon-variants dnp_r128fslwnp,dnp_r128fslwnpx --shapes $S --out "$OUT" > "$OUT/bench_pairs_page.log" 2>&1
mv "$OUT/gluon.md" "$OUT/pairs_page.md"; mv "$OUT/gluon.json" "$OUT/pairs_page.json"
for f in pairs_group pairs_page; do echo "== $f"; grep -v "^|---" "$OUT/$f.md"; done
