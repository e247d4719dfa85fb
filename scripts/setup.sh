#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with everything the project needs (no GPU, PyPI only),
# then build the wheel (Rust extension + kernels), install it and convert the default model once.
# Idempotent: dependencies are installed once per requirements change; the wheel is rebuilt every
# time (seconds when warm); the converted model is reused. Each step says what runs and how long
# it took.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OSCAR_VENV:-.venv}
PY=${PYTHON:-python3}
if ! command -v cargo >/dev/null; then
  echo "setup: cargo (Rust) is needed to build the extension: https://rustup.rs" >&2
  exit 1
fi

# step NAME "NOTE" COMMAND...: print what runs, run it, print how long it took.
step() {
  local name=$1 note=$2 t0=$SECONDS
  shift 2
  echo "setup: $name ($note) ..."
  "$@"
  echo "setup: $name: done in $((SECONDS - t0)) s"
}

dependencies() {
  local free_gb
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 10 ]; then
    echo "setup: warning: ${free_gb} GB free here; the dependencies take ~6.6 GB installed (PyPI's" \
      "torch brings its CUDA libraries), the build, the converted test models and the tests ~2.5 GB more" >&2
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # One pip call per large wheel (requirements/heavy.txt says why), then everything else.
  local req
  while read -r req; do
    case $req in '' | '#'*) continue ;; esac
    "$VENV/bin/python" -m pip install -q --no-deps "$req"
  done < requirements/heavy.txt
  "$VENV/bin/python" -m pip install -q -r requirements/ci.txt
  "$VENV/bin/python" -m pip install -q --no-deps -r requirements/nodeps.txt
}

[ -x "$VENV/bin/python" ] || step "virtualenv" "$VENV" "$PY" -m venv "$VENV"
stamp="$VENV/.oscar-deps-$(cat requirements/heavy.txt requirements/ci.txt requirements/nodeps.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  step "dependencies" "pinned, from PyPI: torch, transformers, SGLang, ...; ~2 min" dependencies
  touch "$stamp"
else
  echo "setup: dependencies: up to date"
fi
rm -rf dist
step "Rust extension" "maturin build --release of the wheel; ~1 min cold, seconds warm" \
  "$VENV/bin/maturin" build --release --quiet -o dist
step "wheel" "pip install dist/oscar_sgl-*.whl" \
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall dist/oscar_sgl-*.whl
step "default model" "SmolLM2-135M-Instruct GGUF converted once into an HF folder, ~20 s; reused afterwards" \
  "$VENV/bin/oscar-sgl" model path
echo "setup: ok ($("$VENV/bin/python" -c 'import oscar_sgl, sys; print("oscar_sgl", oscar_sgl.__version__, "python", sys.version.split()[0])'))"
