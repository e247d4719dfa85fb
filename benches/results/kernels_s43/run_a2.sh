#!/usr/bin/env bash
# Session 43, calls A2 and A3 (right after call A on the same held H100; repo root): more of call A's
# side-by-side runs, which its time guard had left out, each bounded by `timeout` for the session's last
# device seconds. SPECS: which (default: both calls' lists, A2's then A3's).
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/benches/serving/stand_in SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
cp triton_kernels/*.py /tmp/site/oscar_sgl/kernels/ 2>/dev/null
A2=("ab_x98 long_gluon=0 long_gluon=1 group 2 1x98304" "ab_pdl long_gluon=1 long_gluon=1,merge_pdl=True group 2 1x131072")
A3=("ab_forms long_gluon=1 long_gluon=1,long_variant=dnp_r128fslwnkv group 2,4 1x131072"
    "ab_waves long_gluon=1 long_gluon=1,long_waves=15.5 group 2 1x131072"
    "ab_rp long_gluon=1 long_gluon=1,long_variant=rp_r168fslwnk group 2 1x131072"
    "ab_empty32 long_gluon=0 long_gluon=1073741824 group 2,4 1x32768")
for spec in "${A2[@]}" "${A3[@]}"; do
  set -- $spec
  timeout ${AB_S:-55} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats $4 --bits $5 --repeats 3 \
    --shapes $6 --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $?"; grep RESULT "$OUT/$1.log"
done
