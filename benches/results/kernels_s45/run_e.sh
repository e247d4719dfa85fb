#!/usr/bin/env bash
# Session 45, call E (repo root, carry [".bundle", "dist", ".peers"]): (0) the OScaR authors' kernel built in the
# background for call F's kernels.md regeneration (MAX_JOBS 12; left in /tmp/oscar-authors-build and, xz'd, in
# $OUT for .peers/); (1) meanwhile, a single request's Triton stage 1 under a register cap at the split count
# that fills the programs per SM the cap allows (session 44's run_d.sh, not run then): the default (248
# registers, 8 one-warp programs per SM, 128 splits) against 208 (9 per SM, 147 splits), 192 (10, 164) and 168
# (12, 197), and the default's registers at 164 splits (more splits alone, as a control).
set -u
t0=$SECONDS
source benches/results/kernels_gluon_s37/prelude.sh
export PYTHONPATH=$PWD/benches/serving/stand_in:$PYTHONPATH SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
if ! ls /tmp/oscar-authors-build/oscar_cuda*.so >/dev/null 2>&1; then
  (MAX_JOBS=${AUTHORS_JOBS:-12} bash benches/peers/build_oscar_authors.sh /tmp/oscar-authors-build > "$OUT/authors_build.log" 2>&1;
   echo "authors build rc $? at $((SECONDS - t0)) s" >> "$OUT/authors_build.log") &
fi
ab() {  # name, a, b, formats, bits, shapes
  timeout ${AB_S:-75} python3 benches/kernels/tuning_ab.py --a "$2" --b "$3" --agree 1e-2 --formats "$4" --bits "$5" \
    --repeats 3 --shapes "$6" --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc $? at $((SECONDS - t0)) s"; cat "$OUT/$1/ab.md" 2>/dev/null || tail -5 "$OUT/$1.log"
}
S=${SHAPES:-1x131072,1x32768}
ab ab_r192 "" maxnreg=192,num_splits=164 group 2 $S
ab ab_r208 "" maxnreg=208,num_splits=147 group 2 $S
ab ab_r168 "" maxnreg=168,num_splits=197 group 2 $S
ab ab_s164 "" num_splits=164 group 2 $S
while [ -n "$(jobs -r)" ] && [ $((SECONDS - t0)) -lt ${WAIT_UNTIL:-570} ]; do sleep 5; done  # the authors' build
echo "left at $((SECONDS - t0)) s"
tail -3 "$OUT/authors_build.log" 2>/dev/null
for d in ab_r192 ab_r208 ab_r168 ab_s164; do [ -f "$OUT/$d/ab.md" ] && cp "$OUT/$d/ab.md" "$OUT/$d.md"; done
rm -f "$OUT"/oscar_cuda*.so; ls -la "$OUT"
