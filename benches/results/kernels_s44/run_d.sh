#!/usr/bin/env bash
# Session 44, call D (repo root, carry [".bundle", "dist", ".peers"]): a single request's Triton stage 1 under a
# register cap, at the split count that fills the programs per SM the cap allows (the default: 248 registers,
# 8 one-warp programs per SM, 128 splits; 192: 10 per SM, 164 splits, 64 B of stack; 208: 9, 147 splits, 32 B;
# sm_90 SASS, Triton 3.6: the sealed-tile loop 870 -> 943 / 915 instructions at INT2).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
ab() {  # name, a, b, formats, bits, shapes
  timeout ${AB_S:-60} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats "$4" --bits "$5" \
    --repeats 3 --shapes "$6" --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $? at $((SECONDS - t0)) s"; cat "$OUT/$1/ab.md" 2>/dev/null || tail -5 "$OUT/$1.log"
}
ab ab_r192 "" maxnreg=192,num_splits=164 group 2 1x131072,1x32768
ab ab_r208 "" maxnreg=208,num_splits=147 group 2 1x131072,1x32768
