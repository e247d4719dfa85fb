#!/usr/bin/env bash
# Make the two archives benches/peers/build_oscar_authors.sh expects in .peers/ (ignored by git;
# add `/.peers/` to .git/info/exclude), from local git clones of
#   https://github.com/ZunhaiSu/OScaR-KV-Quant   (their release; commit d2109f5 was measured)
#   https://github.com/NVIDIA/cutlass            (their submodule commit 3fe62887)
#
#   bash benches/peers/prepare_sources.sh OSCAR_CLONE CUTLASS_CLONE
#
# Only what the build needs is packed: their csrc/, oscar/ and licence, and CUTLASS's include/.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OSCAR_CLONE CUTLASS_CLONE"; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.peers"
git -C "$1" archive --format=tar --prefix=OScaR-KV-Quant/ HEAD csrc oscar LICENSE | xz -T0 > "$root/.peers/oscar-authors.tar.xz"
git -C "$2" archive --format=tar 3fe62887d8dd75700fdaf57f9c181878701b0802 include | xz -T0 > "$root/.peers/cutlass-include.tar.xz"
echo "$(git -C "$1" rev-parse --short HEAD) (authors), 3fe62887 (CUTLASS) -> $root/.peers/"
ls -la "$root/.peers"
