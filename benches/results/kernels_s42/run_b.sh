#!/usr/bin/env bash
# Session 42, call B (repo root, carry [".bundle", "dist"]; .bundle/gluon_decode_e7968d2.py is
# `git show e7968d2:triton_kernels/gluon_decode.py`): the Gluon butterfly (the fused variants' query
# rotation and the partials' inverse rotation) in its own layout, lane shuffles for the upper index bits:
# (1) the Gluon decode and write GPU test files and the kernel path's CUDA-graph tests; (2) the Gluon
# stage 1's code of e7968d2 (arm a) against this tree's (arm b), the launcher's defaults, whole steps;
# (3) one request at 8 KV heads on the Gluon stage 1 again, at 128, 197 and 255 splits.
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
OMP_NUM_THREADS=1 timeout ${TESTS_S:-210} python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -q --timeout=150 -rfE \
  tests/test_kernels_decode_gluon.py tests/test_kernels_write.py tests/test_sglang_kernel_path.py \
  -k "not test_sglang_kernel_path or (graph and not cpu)" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -4 "$OUT/gpu_tests.log"
timeout ${AB_S:-230} python3 benches/kernels/tuning_ab.py --a-gluon .bundle/gluon_decode_e7968d2.py --b '' --agree 1e-5 \
  --formats group --bits 2,4 --repeats 3 --shapes 2x65536,4x32768,8x32768,16x65536,32x8192,64x4096 \
  --out "$OUT/ab_fwht" > "$OUT/ab_fwht.log" 2>&1
echo "ab rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_fwht/ab.md" 2>/dev/null || tail -5 "$OUT/ab_fwht.log"
timeout ${SINGLE_S:-130} python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnkv,rp_r168fslwnk --gluon-waves 12,15.5 \
  --gluon-max-splits 255 --shapes 1x131072,1x32768,1x8192,1x2048 --out "$OUT" > "$OUT/bench_single.log" 2>&1
echo "single rc $? at $((SECONDS - t0)) s"
[ -f "$OUT/gluon.md" ] && { mv "$OUT/gluon.md" "$OUT/single_group.md"; mv "$OUT/gluon.json" "$OUT/single_group.json"; grep -v "^|---" "$OUT/single_group.md" | cut -c1-2500; }
