#!/usr/bin/env bash
# Session 44, call C (after call B on the same held machine; carry [".bundle", "dist", ".peers"]): what the
# opt-in long_gluon (session 43) costs and gives on this card, and whether the cost of its empty launch follows
# its program count (long_waves 4: 528 programs on an H200 against 12: 1584), for a launch of fewer programs;
# and the Triton stage 1 of a single request under a register cap (208: 9 programs per SM against 8).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
ab() {  # name, a, b, formats, bits, shapes (left out once the call has run STOP_AT s)
  [ $((SECONDS - t0)) -lt ${STOP_AT:-480} ] || { echo "$1 left out at $((SECONDS - t0)) s"; return; }
  timeout ${AB_S:-150} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats "$4" --bits "$5" \
    --repeats 3 --shapes "$6" --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $? at $((SECONDS - t0)) s"; cat "$OUT/$1/ab.md" 2>/dev/null || tail -5 "$OUT/$1.log"
}
ab ab_empty_w12 long_gluon=0 long_gluon=1073741824 group 2 1x2048,1x8192,1x32768
ab ab_empty_w4 long_gluon=0 long_gluon=1073741824,long_waves=4.0 group 2 1x2048,1x8192,1x32768
ab ab_long long_gluon=0 long_gluon=1 group,page 2,4 1x65536,1x131072
ab ab_maxnreg208 "" maxnreg=208 group 2 1x32768,1x131072
echo "left at $((SECONDS - t0)) s"
