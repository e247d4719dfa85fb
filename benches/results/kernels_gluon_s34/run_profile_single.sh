#!/usr/bin/env bash
# Session 34, device call D (repo root, carry [".bundle", "dist"]): Nsight Compute of stage 1 for one
# request (whole step, the write fused): the Triton default against the Gluon default variant and the
# register-prefetch one at the same 128 splits, at 32K (where Gluon loses) and 128K tokens (where it wins).
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
export PROFILE_ARGS="--mode fused" PROFILE_TIMEOUT=100
bash benches/kernels/run_gpu_profile.sh 1x32768 default gluon:rp_r168fslwnk gluon:dnp_r128fslwnk
bash benches/kernels/run_gpu_profile.sh 1x131072 default gluon:rp_r168fslwnk
for f in "$OUT"/ncu_*.txt; do
  echo "== $(basename "$f")"
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Instructions |Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|No Eligible|Eligible Warps Per Scheduler|Active Warps Per Scheduler|Grid Size|Waves Per SM|Theoretical Occupancy)\b" "$f" | head -20
  grep -E "Stall|stall" "$f" | grep -iE "long scoreboard|wait|barrier|math pipe|short scoreboard|not selected|mio" | head -8
done
