#!/usr/bin/env bash
# Build the OScaR authors' CUDA kernels (github.com/ZunhaiSu/OScaR-KV-Quant) for sm_90 on the GPU
# machine, for the peer column of benches/kernels/bench_decode.py (--authors BUILD_DIR).
#
# Their code is never committed here. It is expected OUTSIDE the tracked tree, either as
#   OSCAR_AUTHORS_SRC=<their checkout>  CUTLASS_INCLUDE=<cutlass/include at commit 3fe62887>
# or as the two archives that benches/peers/prepare_sources.sh writes into the ignored folder .peers/
# (carried to the device machine with the device tool's `carry: [".peers", ...]`):
#   .peers/oscar-authors.tar.xz   .peers/cutlass-include.tar.xz
#
#   bash benches/peers/build_oscar_authors.sh [BUILD_DIR]     # default /tmp/oscar-authors-build
#
# ~3-6 min with 16 cores (ninja; nvcc 13, torch 2.11 there). Prints the .so path; copies it to
# $OUT when OUT is set, with oscar_cuda.so.xz for .peers/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-/tmp/oscar-authors-build}
if [ -z "${OSCAR_AUTHORS_SRC:-}" ]; then
  [ -f .peers/oscar-authors.tar.xz ] || { echo "no OSCAR_AUTHORS_SRC and no .peers/oscar-authors.tar.xz (benches/peers/prepare_sources.sh)"; exit 3; }
  mkdir -p /tmp/peers && tar xJf .peers/oscar-authors.tar.xz -C /tmp/peers
  export OSCAR_AUTHORS_SRC=/tmp/peers/OScaR-KV-Quant
fi
if [ -z "${CUTLASS_INCLUDE:-}" ]; then
  [ -f .peers/cutlass-include.tar.xz ] || { echo "no CUTLASS_INCLUDE and no .peers/cutlass-include.tar.xz (benches/peers/prepare_sources.sh)"; exit 3; }
  mkdir -p /tmp/peers/cutlass && tar xJf .peers/cutlass-include.tar.xz -C /tmp/peers/cutlass
  export CUTLASS_INCLUDE=/tmp/peers/cutlass/include
fi
echo "authors' sources: $OSCAR_AUTHORS_SRC; CUTLASS headers: $CUTLASS_INCLUDE"
nvcc --version | tail -2
python3 benches/peers/oscar_authors.py build --build-dir "$BUILD"
# $OUT: the .so, and compressed for .peers/ (benches/kernels/regenerate.sh then skips this build on a
# machine of the same image)
if [ -n "${OUT:-}" ]; then
  cp "$BUILD"/oscar_cuda*.so "$OUT"/ 2>/dev/null || true
  xz -T0 -6 -c "$BUILD"/oscar_cuda.so > "$OUT"/oscar_cuda.so.xz 2>/dev/null || true
fi
