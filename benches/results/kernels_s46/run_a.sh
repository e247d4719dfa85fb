#!/usr/bin/env bash
# Session 46, call A (repo root, carry [".bundle", "dist"]): where a single request's Gluon step loses its time
# against the Triton step at 2K-32K tokens (issue 14 item 2). Per-kernel GPU times of whole decode steps
# (step_kernels.py: CUDA-graph replays under torch.profiler) for the launcher's Triton step, the Gluon
# default's lane form at the same 128 splits, and at 197 splits (12 programs per SM); then Nsight Compute
# reports of both stage 1s in the whole step (--mode fused) at (1, 2048) and (1, 32768). Everything back
# as call_a.tgz, re-made after each stage (8 files come back at most, and a call cut short keeps what it made).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
R=/tmp/call_a; mkdir -p "$R"
pack() { tar czf "$OUT/call_a.tgz" --exclude='*.ncu-rep' -C /tmp call_a; }
SH=${SHAPES:-1x2048,1x8192,1x32768,1x131072}
V=dnp_r128fslwnkvh
for arm in "triton:" "g128:gluon=True,gluon_variant=$V" "g197:gluon=True,gluon_variant=$V,num_splits=197"; do
  name=${arm%%:*}; set_=${arm#*:}
  timeout 150 python3 benches/kernels/step_kernels.py --shapes "$SH" --bits 2 ${set_:+--set "$set_"} \
    --out "$R/steps_$name.json" > "$R/steps_$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; grep "SPAN\|KERNELS" "$R/steps_$name.log" | cut -c1-160; pack
done
for shape in 1x2048 1x32768; do
  [ $((SECONDS - t0)) -gt ${NCU_UNTIL:-420} ] && break
  OUT=$R PROFILE_ARGS="--mode fused" PROFILE_TIMEOUT=90 bash benches/kernels/run_gpu_profile.sh "$shape" default "gluon:$V"
  pack
done
for f in "$R"/ncu_*.txt; do
  [ -f "$f" ] || continue
  echo "== $f"; grep -E "^\s+(Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Grid Size|Executed Instructions |Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Memory Throughput|DRAM Throughput|Waves Per SM)" "$f" | head -20
done
echo "call A done at $((SECONDS - t0)) s"
pack; ls -la "$OUT"
