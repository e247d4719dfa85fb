#!/usr/bin/env bash
# Regenerate benches/results/kernels.md (+ kernels.json, kernels.png) on a GPU machine, every column of
# issue 14's target table in one run: OScaR INT2 / INT4 decode (the launcher's default launch, write
# fused), torch SDPA on BF16, SGLang 0.5.23's Triton BF16 decode, the OScaR authors' CUDA kernel (their
# group 32 and 128), extend vs SGLang's BF16 extend, the write path's share, the seal.
#
#   bash benches/kernels/regenerate.sh
#
# Needs: a CUDA GPU; SGLang 0.5.23 importable (PYTHONPATH, or /tmp/site as `benches/serving/run_gpu.sh
# setup` unpacks it); oscar_sgl installed or python/ with its built extension; nvcc and the authors'
# sources + CUTLASS headers outside the tracked tree (benches/peers/build_oscar_authors.sh: OSCAR_AUTHORS_SRC
# and CUTLASS_INCLUDE, or .peers/ from benches/peers/prepare_sources.sh). The authors' build (~8 min on
# 16 cores) is kept in AUTHORS_BUILD and reused while its .so is there, or skipped where .peers/ holds
# oscar_cuda.so.xz from an earlier build on the same machine image and it loads (the build script
# leaves that file in $OUT); AUTHORS_BUILD=none leaves that column out (the report then says "not
# measured" for it).
#
# Then, where Nsight Compute (ncu) is installed, "Where the time goes": stage 1 of the default decode step
# profiled at PROFILE_SHAPES (BITS[p]:BxCTX, default the INT2 target shapes, INT4 at (8, 32768) and INT2 at
# (8, 32768) in the server's default format ("2p": page-grid key ranges); ~30 s each)
# with its stall samples and shared-memory wavefronts, the reports kept in REPORT_DIR/ncu/ and read by
# benches/kernels/ncu_report.py into a section appended to kernels.md. NCU_PROFILE=0 leaves it out.
#
# Where it writes: REPORT_DIR (default benches/results): kernels.md, kernels.json, kernels.png, ncu/, and
# kernels_bench.log (the benchmark's output). On the lent device machine: REPORT_DIR=$OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
REPORT_DIR=${REPORT_DIR:-benches/results}
AUTHORS_BUILD=${AUTHORS_BUILD:-/tmp/oscar-authors-build}
mkdir -p "$REPORT_DIR"
if [ -d /tmp/site/sglang ]; then export PYTHONPATH=/tmp/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}; fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'" || { echo "regenerate.sh: needs a CUDA GPU"; exit 3; }
python3 -c "import sglang" 2>/dev/null || { echo "regenerate.sh: SGLang does not import (PYTHONPATH, or benches/serving/run_gpu.sh setup)"; exit 3; }
authors=()
if [ "$AUTHORS_BUILD" != "none" ]; then
  # a .so an earlier build on the same machine image made (.peers/oscar_cuda.so.xz: the build script
  # leaves oscar_cuda.so.xz in $OUT), used where it loads; else the build
  if ! ls "$AUTHORS_BUILD"/oscar_cuda*.so >/dev/null 2>&1 && [ -f .peers/oscar_cuda.so.xz ]; then
    mkdir -p "$AUTHORS_BUILD" && xz -dc .peers/oscar_cuda.so.xz > "$AUTHORS_BUILD/oscar_cuda.so"
    if [ -z "${OSCAR_AUTHORS_SRC:-}" ]; then
      [ -d /tmp/peers/OScaR-KV-Quant ] || { mkdir -p /tmp/peers && tar xJf .peers/oscar-authors.tar.xz -C /tmp/peers; }
      export OSCAR_AUTHORS_SRC=/tmp/peers/OScaR-KV-Quant
    fi
    if python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'benches/peers'); import oscar_authors; oscar_authors.load(Path(sys.argv[1]))" \
        "$AUTHORS_BUILD" > "$REPORT_DIR/authors_build.log" 2>&1; then
      echo "regenerate.sh: the authors' kernel from .peers/oscar_cuda.so.xz (a build on this machine image)"
    else
      echo "regenerate.sh: .peers/oscar_cuda.so.xz does not load here (tail of $REPORT_DIR/authors_build.log below); building"
      tail -3 "$REPORT_DIR/authors_build.log"; rm -f "$AUTHORS_BUILD"/oscar_cuda*.so
    fi
  fi
  if ! ls "$AUTHORS_BUILD"/oscar_cuda*.so >/dev/null 2>&1; then
    echo "regenerate.sh: building the authors' kernel into $AUTHORS_BUILD"
    OUT= bash benches/peers/build_oscar_authors.sh "$AUTHORS_BUILD" > "$REPORT_DIR/authors_build.log" 2>&1 \
      || { echo "regenerate.sh: the authors' build failed (tail of $REPORT_DIR/authors_build.log):"; tail -20 "$REPORT_DIR/authors_build.log"; exit 4; }
  fi
  # the benchmark imports their Python packing code from the same sources (oscar_authors.py)
  if [ -z "${OSCAR_AUTHORS_SRC:-}" ]; then
    [ -d /tmp/peers/OScaR-KV-Quant ] || { mkdir -p /tmp/peers && tar xJf .peers/oscar-authors.tar.xz -C /tmp/peers; } \
      || { echo "regenerate.sh: no OSCAR_AUTHORS_SRC and no .peers/oscar-authors.tar.xz"; exit 4; }
    export OSCAR_AUTHORS_SRC=/tmp/peers/OScaR-KV-Quant
  fi
  authors=(--authors "$AUTHORS_BUILD")
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${OSCAR_COMMIT:-unknown}")
dirty=0
if git rev-parse HEAD >/dev/null 2>&1 && ! git diff --quiet HEAD -- triton_kernels python benches/kernels 2>/dev/null; then dirty=1; fi
tmp=$(mktemp -d)
OSCAR_COMMIT=${OSCAR_COMMIT:-$commit} OSCAR_DIRTY=${OSCAR_DIRTY:-$dirty} \
  python3 benches/kernels/bench_decode.py --quick "${authors[@]}" --out "$tmp" 2>&1 | tee "$REPORT_DIR/kernels_bench.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] && [ -f "$tmp/kernels.md" ] || { echo "regenerate.sh: the benchmark failed (rc $rc); $REPORT_DIR/kernels.md left as it was"; exit 5; }
cp "$tmp/kernels.md" "$tmp/kernels.json" "$REPORT_DIR"/
[ -f "$tmp/kernels.png" ] && cp "$tmp/kernels.png" "$REPORT_DIR"/
rm -rf "$tmp"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ "${NCU_PROFILE:-1}" != 0 ] && [ -n "$NCU" ]; then
  rm -rf "$REPORT_DIR/ncu" && mkdir -p "$REPORT_DIR/ncu"
  # the same metrics as benches/kernels/ncu_report.py NCU_METRICS (tests/test_bench_report.py checks it)
  metrics="regex:smsp__pcsamp_warps_issue_stalled_.*,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
  # BITS[p]:BxCTX; "p": the pool in the INT2 server default's format (page-grid key ranges)
  for spec in ${PROFILE_SHAPES:-2:1x131072 2:8x32768 2:16x65536 4:8x32768 2p:8x32768}; do
    bits=${spec%%:*}; fmt=group; tag=""
    if [ "${bits%p}" != "$bits" ]; then bits=${bits%p}; fmt=page; tag=_page; fi
    NCU="$NCU" OUT="$REPORT_DIR/ncu" PROFILE_ARGS="--mode fused --bits $bits --format $fmt" PROFILE_TAG="_int$bits$tag" \
      NCU_EXTRA="--metrics $metrics" bash benches/kernels/run_gpu_profile.sh "${spec#*:}" default
  done
  python3 benches/kernels/ncu_report.py --bench "$REPORT_DIR/kernels.json" --append "$REPORT_DIR/kernels.md" \
    "$REPORT_DIR"/ncu/ncu_*.txt || echo "regenerate.sh: no usable Nsight Compute report; kernels.md has no 'Where the time goes'"
elif [ "${NCU_PROFILE:-1}" != 0 ]; then
  echo "regenerate.sh: no ncu found: kernels.md has no 'Where the time goes' section"
fi
echo "regenerate.sh: wrote $REPORT_DIR/kernels.md"
