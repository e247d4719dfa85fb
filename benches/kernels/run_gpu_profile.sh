#!/usr/bin/env bash
# Nsight Compute reports of the decode stage-1 kernel, one per configuration (device machine).
#   bash benches/kernels/run_gpu_profile.sh SHAPE CONFIG [CONFIG ...]   e.g. 8x32768 0:0:3:0 32:1:3:16:0:1
# Reports (text) land in $OUT/ncu_<shape>_<config><PROFILE_TAG>.txt. PROFILE_ARGS: more profile_decode.py
# arguments (e.g. "--mode fused": the whole step with the write; "--bits 4").
set -uo pipefail
OUT=${OUT:-/tmp/oscar-bench}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD/python}
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)}
shape=$1; shift
for cfg in "$@"; do
  timeout "${PROFILE_TIMEOUT:-120}" "$NCU" --clock-control none --kernel-name regex:_decode_stage1 --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section InstructionStats --section ComputeWorkloadAnalysis --section SourceCounters ${NCU_EXTRA:-} \
    python3 benches/kernels/profile_decode.py --shape "$shape" --config "$cfg" ${PROFILE_ARGS:-} \
    > "$OUT/ncu_${shape}_${cfg//:/-}${PROFILE_TAG:-}.txt" 2>&1
  echo "ncu $shape $cfg ${PROFILE_ARGS:-}: rc=$? $(grep -c . "$OUT/ncu_${shape}_${cfg//:/-}${PROFILE_TAG:-}.txt") lines"
done
