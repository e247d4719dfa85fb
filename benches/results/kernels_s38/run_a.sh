#!/usr/bin/env bash
# Session 38, call A (repo root, carry [".bundle", "dist", ".peers"]): session 37's two prepared runs in one
# call: the GPU tests with SPREAD_OPEN the launcher's default for single requests (run_tests_default.sh),
# then merge_one_pass's GPU tests and timings (run_one_pass.sh).
set -u
bash benches/results/kernels_gluon_s37/run_tests_default.sh
bash benches/results/kernels_gluon_s37/run_one_pass.sh
