#!/usr/bin/env bash
# Session 48, call C (repo root, carry [".bundle", "dist"]; right after the kernels.md regeneration on the same
# held machine, or alone):
# 1. the GPU tests of the page-grid variants at G_K 32 (session 47's default rule) and of the new
#    dnp_r128fslwnpb (the page default with the next tile's lines prefetched into L2), against the torch reference;
# 2. one request at 32K-131K, whole decode steps (tuning_ab.py: arm a the launcher's Triton step, arm b the
#    Gluon stage 1 at 197 splits), interleaved repeats, outputs compared first: the INT2 default format
#    (page G_K 16) with dnp_r128fslwnpb and dnp_r128fslwnpv, the paper format with dnp_r128fslwnkb, INT4 page pb.
# Everything back as call_c.tgz, re-made after each part (a call cut short keeps what it made).
set -u
source benches/kernels/ab_runs.sh  # call_begin, gpu_tests, ab
call_begin call_c  # t0 before the machine's setup, as the call's time limit counts it
source benches/results/kernels_gluon_s37/prelude.sh
gpu_tests "key_groups_of_32 or fslwnpb or fslwnkb"
P=gluon=True,gluon_variant
L=1x131072,1x65536,1x32768
ab long_page_pb --formats page --shapes $L --bits 2 --b $P=dnp_r128fslwnpb,num_splits=197 --agree 1e-2
ab long_page_pv --formats page --shapes $L --bits 2 --b $P=dnp_r128fslwnpv,num_splits=197 --agree 1e-2
ab long_group_kb --formats group --shapes $L --bits 2 --b $P=dnp_r128fslwnkb,num_splits=197 --agree 1e-2
ab long_page_pb_int4 --formats page --shapes $L --bits 4 --b $P=dnp_r128fslwnpb,num_splits=197 --agree 1e-2
echo "call C done at $((SECONDS - t0)) s"
pack; ls -la "$OUT"
