#!/usr/bin/env bash
# Session 44, call C (repo root, carry [".bundle", "dist", ".peers"]): (1) what one more node of the step's CUDA
# graph costs: an empty launch against a conditional IF node (benches/kernels/graph_node_cost.py); (2) long_gluon's
# empty launch with the merge as its programmatic dependent (merge_pdl: the merge launched while the Gluon launch
# runs); (3) the kernel-path GPU tests with the CPU-interpreter forms skipped in a GPU process (4fec443).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
timeout 90 python3 benches/kernels/graph_node_cost.py --out "$OUT/graph_node_cost.json" > "$OUT/graph_node_cost.log" 2>&1
echo "graph_node_cost rc $? at $((SECONDS - t0)) s"; tail -12 "$OUT/graph_node_cost.log"
timeout 80 python3 benches/kernels/tuning_ab.py --a long_gluon=0 --b long_gluon=1073741824,merge_pdl=True --agree 1e-2 \
  --formats group --bits 2 --repeats 3 --shapes 1x2048,1x32768 --out "$OUT/ab_empty_pdl" > "$OUT/ab_empty_pdl.log" 2>&1
echo "ab_empty_pdl rc $? at $((SECONDS - t0)) s"; cat "$OUT/ab_empty_pdl/ab.md" 2>/dev/null || tail -5 "$OUT/ab_empty_pdl.log"
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -q --timeout=110 -rfE \
  tests/test_sglang_kernel_path.py > "$OUT/kernel_path.log" 2>&1
echo "kernel path rc $? at $((SECONDS - t0)) s"; tail -3 "$OUT/kernel_path.log"
