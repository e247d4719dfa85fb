#!/usr/bin/env bash
# Add to ./.whl (after ../shared/device/fetch-sglang-wheels.sh) the cp312 wheels that importing
# SGLang 0.5.23's memory-pool / attention-backend classes needs beyond the decode kernel, which the
# device machine's image lacks (found by importing them in a bare venv). Run from the repo root.
set -euo pipefail
mkdir -p .whl
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
   --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
   --platform any"
for p in dill apache-tvm-ffi compressed-tensors loguru annotated-types aiohttp multidict yarl propcache \
         aiohappyeyeballs aiosignal frozenlist attrs anyio sniffio; do
  python3 -m pip download -q $P -d .whl "$p"
done
du -sh .whl
