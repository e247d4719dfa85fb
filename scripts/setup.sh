#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with everything the project needs (no GPU, PyPI only),
# then build the wheel (Rust extension + kernels) and install it. Idempotent: dependencies are
# installed once per requirements change; the wheel is rebuilt every time (seconds when warm).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OSCAR_VENV:-.venv}
PY=${PYTHON:-python3}
if ! command -v cargo >/dev/null; then
  echo "setup: cargo (Rust) is needed to build the extension: https://rustup.rs" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.oscar-deps-$(cat requirements/ci.txt requirements/nodeps.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r requirements/ci.txt
  "$VENV/bin/python" -m pip install -q --no-deps -r requirements/nodeps.txt
  touch "$stamp"
fi
rm -rf dist
"$VENV/bin/maturin" build --release --quiet -o dist >/dev/null
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall dist/oscar_sgl-*.whl
echo "setup: ok ($("$VENV/bin/python" -c 'import oscar_sgl, sys; print("oscar_sgl", oscar_sgl.__version__, "python", sys.version.split()[0])'))"
