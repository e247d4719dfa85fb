#!/usr/bin/env bash
# Session 42, call A (repo root, carry [".bundle", "dist"]): (1) session 41's call C, never run: the GPU
# tests of the decode and kernel-path files with merge_one_pass the launcher's default from 64 partials,
# the fixed Gluon routing test, and the two new single-request variants against the reference; (2) one
# request at 8 KV heads on the Gluon stage 1 again, now that the separate merge reads only the non-empty
# splits' rows (merge_one_pass, up to 256 partials): whole steps at the Triton split count (128), at 12
# and 15.5 programs per SM (197 / 255 splits: one wave of 12 / 16), with min_tiles 0 / 4 / 8, and the
# register-prefetch variant; (3) the merge default against the chunked merge forced (session 41's call C).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
OMP_NUM_THREADS=1 timeout 130 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -q --timeout=120 -rfE \
  tests/test_kernels_decode.py tests/test_sglang_kernel_path.py tests/test_kernels_decode_gluon.py \
  -k "((real_sizes or graph or spread or one_pass) and not cpu) or default_decode_runs_the_fused_triton_step or (variants_match_reference and kvm)" \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/gpu_tests.log"
[ "${NO_SINGLE:-0}" = 1 ] || timeout 300 python3 benches/kernels/bench_decode.py --gluon --gluon-step \
  --gluon-variants dnp_r128fslwnkv,dnp_r128fslwnkvm4,dnp_r128fslwnkvm8,rp_r168fslwnk --gluon-waves 12,15.5 \
  --gluon-max-splits 255 --shapes 1x131072,1x32768,1x8192,1x2048 --out "$OUT" > "$OUT/bench_single.log" 2>&1
echo "single rc $? at $((SECONDS - t0)) s"
[ -f "$OUT/gluon.md" ] && { mv "$OUT/gluon.md" "$OUT/single_group.md"; mv "$OUT/gluon.json" "$OUT/single_group.json"; grep -v "^|---" "$OUT/single_group.md" | cut -c1-3000; }
[ "${NO_AB:-0}" = 1 ] || timeout 90 python3 benches/kernels/tuning_ab.py --agree 1e-3 --a merge_one_pass=False --b merge_one_pass=None --formats group \
  --bits 2 --repeats 5 --shapes 1x2048,1x131072,4x32768,16x65536 --out "$OUT/ab_default" > "$OUT/ab_default.log" 2>&1
echo "ab rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_default/ab.md" 2>/dev/null || tail -5 "$OUT/ab_default.log"
