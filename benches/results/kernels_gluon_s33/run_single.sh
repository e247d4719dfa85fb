#!/usr/bin/env bash
# Session 33, first device call (repo root, carry [".bundle", "dist"]): single requests and 2-3 requests
# (8-24 (request, KV head) pairs, where the default runs the Triton stage 1) on the Gluon stage 1 at
# hundreds of splits: the default variant, its open share and min_tiles=8, at the launcher's split
# count, at 24 and 32 programs per SM and at the one-wave count (@fit), INT2 and INT4; then the
# server's page-grid format the same way.
set -u
bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnk,dnp_r128fslwnkx,dnp_r128fslwnkm8 --gluon-fit --gluon-waves 24,32 --gluon-max-splits 512 \
  --shapes 1x131072,1x32768,1x8192,2x65536,2x8192,3x32768 --out "$OUT" > "$OUT/bench_group.log" 2>&1
mv "$OUT/gluon.md" "$OUT/single_group.md"; mv "$OUT/gluon.json" "$OUT/single_group.json"
timeout 170 python3 benches/kernels/bench_decode.py --gluon --gluon-step --gluon-format page --gluon-block-n 32 \
  --gluon-variants dnp_r128fslwnp,dnp_r128fslwnpx --gluon-fit --gluon-waves 32 --gluon-max-splits 512 \
  --shapes 1x131072,1x32768,1x8192,2x65536 --out "$OUT" > "$OUT/bench_page.log" 2>&1
mv "$OUT/gluon.md" "$OUT/single_page.md"; mv "$OUT/gluon.json" "$OUT/single_page.json"
for f in single_group single_page; do echo "== $f"; grep -v "^|---" "$OUT/$f.md"; done
