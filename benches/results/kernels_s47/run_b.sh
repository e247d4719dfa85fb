#!/usr/bin/env bash
# Session 47, call B (repo root, carry [".bundle", "dist"]; any card). Whole decode steps, CUDA graphs over
# distinct KV copies (tuning_ab.py: arm a the launcher's step, arm b the same with FIELD=VALUE changes,
# interleaved repeats, outputs compared first):
# 1. page-grid key ranges at G_K 32 (`--formats page32`) on the Gluon stage 1 (arm b; opt-in, the launcher runs
#    the Triton one for them) at the Gluon default's split counts, INT2 and INT4;
# 2. the paper's format and the INT2 default (G_K 16) as the launcher runs them, in the same call (a = b);
# 3. one request at 32K-131K on the Gluon stage 1 at 197 splits with the next tile's lines prefetched into L2
#    (dnp_r128fslwnkb) and without (dnp_r128fslwnkvh), against the launcher's Triton step.
# Everything back as call_b.tgz, re-made after each run (a call cut short keeps what it made).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
R=/tmp/call_b; mkdir -p "$R"
pack() { tar czf "$OUT/call_b.tgz" -C /tmp call_b; }
source benches/kernels/ab_runs.sh  # ab NAME ARGS...: one tuning_ab.py run
P=gluon=True,gluon_variant
ab page32_8x32768 --formats page32 --shapes 8x32768 --bits 2,4 --b $P=dnp_r128fslwnpv,num_splits=32 --agree 1e-2
ab base --formats group,page --shapes 8x32768,16x65536,32x8192 --bits 2,4 --b '' --repeats 1
ab long_b --formats group --shapes 1x131072,1x65536,1x32768 --bits 2 --b $P=dnp_r128fslwnkb,num_splits=197 --agree 1e-2
ab page32_16x65536 --formats page32 --shapes 16x65536 --bits 2,4 --b $P=dnp_r128fslwnpv,num_splits=16 --agree 1e-2
ab page32_32x8192 --formats page32 --shapes 32x8192 --bits 2,4 --b $P=dnp_r128fslwnpxv,num_splits=7 --agree 1e-2
ab long_vh --formats group --shapes 1x131072,1x65536,1x32768 --bits 2 --b $P=dnp_r128fslwnkvh,num_splits=197 --agree 1e-2
echo "call B done at $((SECONDS - t0)) s"
pack; ls -la "$OUT"
