#!/usr/bin/env bash
# One device-machine run: install the SGLang wheels (for its Triton decode kernel), run the kernel
# test suite on the GPU (compiled kernels, tiny and real sizes), then the decode benchmark.
#
# From the repo root, after `bash ../shared/device/fetch-sglang-wheels.sh` filled .whl/ here (or after
# `bash benches/serving/run_gpu.sh setup` on the same machine):
#   OSCAR_COMMIT=$(git rev-parse HEAD) bash benches/kernels/run_gpu.sh [bench_decode.py args]
# Everything lands in $OUT: env.log, gpu_tests.log, bench.log, kernels.json, kernels.md, kernels.png.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/oscar-bench}
mkdir -p "$OUT"
# SGLang for its Triton kernels: the wheels of fetch-sglang-wheels.sh in .whl/, or a /tmp/site that
# `benches/serving/run_gpu.sh setup` already unpacked (its bundle, with our wheel installed there).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site/sglang ] || { echo "run_gpu.sh: no SGLang in /tmp/site (carry .whl/ or run benches/serving/run_gpu.sh setup first)"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/python
# The Rust extension (abi3) comes built from the developer machine: carry python/oscar_sgl/_core.abi3.so
# (or install dist/*.whl into /tmp/site, as the serving setup does).
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  python3 -c "from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd; print('sglang decode kernel importable')"
  # SGLang's pool / backend classes on CUDA import the real sgl_kernel (int8_scaled_mm,
  # sgl_kernel.quantization, scalar_types objects), which the device image lacks and which cannot be
  # carried (see README): tests/test_sglang_kernel_path.py runs on CPU only. Recorded here each run:
  python3 -c "from sglang.srt.mem_cache.memory_pool import ReqToTokenPool" 2>&1 | tail -1
} 2>&1 | tee "$OUT/env.log"
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  OMP_NUM_THREADS=2 timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -p no:cacheprovider -p no:benchmark \
    -n "${TEST_WORKERS:-8}" -v --tb=short -rfE --durations=25 --timeout=120 --junitxml="$OUT/gpu_tests.xml" \
    ${TEST_FILES:-tests/test_kernels_seal.py tests/test_kernels_write.py tests/test_kernels_decode.py tests/test_kernels_extend.py} \
    2>&1 | grep -v "^bringing up\|PytestBenchmarkWarning\|warner(" | tee "$OUT/gpu_tests.log"
fi
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 benches/kernels/bench_decode.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
fi
# Optional Nsight Compute reports of stage 1: PROFILE="SHAPE CONFIG [CONFIG ...]" (run_gpu_profile.sh)
if [ -n "${PROFILE:-}" ]; then
  # shellcheck disable=SC2086
  bash benches/kernels/run_gpu_profile.sh $PROFILE 2>&1 | tee "$OUT/profile.log"
fi
