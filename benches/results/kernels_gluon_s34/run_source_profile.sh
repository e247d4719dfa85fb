#!/usr/bin/env bash
# Session 34, device call E (repo root, carry [".bundle", "dist"]): where the default step's stage 1
# stalls, per SASS instruction: Nsight Compute's warp-state samples by instruction (source page,
# SASS) of the launcher's default launch (the Gluon default variant) at (8, 32768) INT2, whole step.
set -u
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
nvidia-smi --query-gpu=name --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1
for shape in 8x32768 1x32768; do
  timeout 150 "$NCU" --clock-control none --kernel-name regex:_decode_stage1 --launch-skip 1 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SchedulerStats --section SpeedOfLight \
    --import-source no -o "/tmp/src_$shape" -f \
    python3 benches/kernels/profile_decode.py --shape $shape --config default --mode fused > "$OUT/ncu_src_$shape.log" 2>&1
  echo "ncu $shape rc=$?"
  "$NCU" -i "/tmp/src_$shape.ncu-rep" --page source --csv --print-source sass > "/tmp/src_$shape.csv" 2> "$OUT/src_$shape.err"
  echo "source page rc=$? $(wc -l < /tmp/src_$shape.csv) lines"
  xz -c "/tmp/src_$shape.csv" > "$OUT/src_$shape.csv.xz"
  "$NCU" -i "/tmp/src_$shape.ncu-rep" --page raw --csv 2>/dev/null | xz -c > "$OUT/raw_$shape.csv.xz"
done
ls -la "$OUT"
