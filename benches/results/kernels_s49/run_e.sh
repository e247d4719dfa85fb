#!/usr/bin/env bash
# Session 49, call E (repo root, carry [".bundle", "dist"]; alone, or right after the kernels.md regeneration on the
# same held machine): where a single request's Gluon stage 1 spends the ~14 us that do not grow with the context
# (kernels_s49 §5), and the session's three new variants.
# 1. GPU tests: the new variants against the torch reference (test_gluon_variants_match_reference), long_gluon's step
#    with the next-tile forms (plain "b" and lane "bh") against each launch alone.
# 2. Whole decode steps, one request, INT2, 197 splits, tuning_ab.py arm a against arm b directly (interleaved
#    repeats, outputs compared first): kb (session 48) against its lane form kbh, against split_rotation (the query
#    rotation and the write in a launch of their own before the stage 1), against the unfused dnp_r128slwnkb (nothing
#    rotated in the stage 1: the merge rotates once per query head); the page format's pb against pbh; then the
#    faster forms as long_gluon's launch (every length >= 1 token on it) against the launcher's Triton step.
# 3. Per-kernel GPU times (step_kernels.py) of kb, kbh and slwnkb at 2K-131K: the fixed part and the per-tile slope.
# Everything back as call_e.tgz, re-made after each part (a call cut short keeps what it made).
set -u
source benches/kernels/ab_runs.sh  # call_begin, gpu_tests, ab
call_begin call_e  # t0 before the machine's setup, as the call's time limit counts it
source benches/results/kernels_gluon_s37/prelude.sh
gpu_tests "(variants_match_reference and (fslwnkbh or fslwnpbh or slwnkb)) or long_gluon_step_equals"
G=gluon=True,num_splits=197,gluon_variant
L=1x131072,1x32768
KB=$G=dnp_r128fslwnkb
ab kb_kbh --formats group --shapes $L --bits 2 --a $KB --b $G=dnp_r128fslwnkbh --agree 1e-2
ab kb_splitrot --formats group --shapes $L --bits 2 --a $KB --b $KB,split_write=True,split_rotation=True --agree 1e-2
ab kb_unfused --formats group --shapes $L --bits 2 --a $KB --b $G=dnp_r128slwnkb --agree 1e-2
ab pb_pbh --formats page --shapes $L --bits 2 --a $G=dnp_r128fslwnpb --b $G=dnp_r128fslwnpbh --agree 1e-2
ab dual_pb --formats page --shapes 1x131072,1x32768,1x8192 --bits 2 --b long_gluon=1,long_variant=dnp_r128fslwnpb --agree 1e-2
ab dual_pbh --formats page --shapes 1x131072,1x32768,1x8192 --bits 2 --b long_gluon=1,long_variant=dnp_r128fslwnpbh --agree 1e-2
for arm in "kb:$KB" "kbh:$G=dnp_r128fslwnkbh" "slwnkb:$G=dnp_r128slwnkb"; do
  [ $((SECONDS - t0)) -gt ${UNTIL:-480} ] && break
  name=${arm%%:*}
  timeout 150 python3 benches/kernels/step_kernels.py --shapes 1x2048,1x8192,1x32768,1x131072 --bits 2 \
    --set "${arm#*:}" --out "$R/steps_$name.json" > "$R/steps_$name.log" 2>&1
  echo "steps $name rc $? at $((SECONDS - t0)) s"; grep "KERNELS" "$R/steps_$name.log" | cut -c1-120; pack
done
echo "call E done at $((SECONDS - t0)) s"
pack; ls -la "$OUT"
