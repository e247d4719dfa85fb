# Sourced by the session run scripts under benches/results/ (repo root).
#
# ``call_begin NAME``, before benches/results/kernels_gluon_s37/prelude.sh (so that UNTIL counts the
# machine's setup): the call's clock t0, its results folder R=/tmp/NAME, ``pack`` (R as $OUT/NAME.tgz: 8
# files come back at most, and a call cut short keeps what the last pack made) and the card's name and
# clocks in R/card.txt.
#
# ``gpu_tests SELECTION``: ``pytest -k SELECTION`` over tests/test_kernels_decode_gluon.py under
# ``timeout $TEST_TIMEOUT`` (default 200 s), log in R/gpu_tests.log, its tail printed, then ``pack``.
#
# ``ab NAME ARGS...`` runs ``benches/kernels/tuning_ab.py ARGS --out $R/NAME`` (log in $R/NAME.log) under
# ``timeout $AB_TIMEOUT`` (default 150 s), unless more than $UNTIL seconds (default 480) have passed since
# $t0; it prints the run's RESULT lines and calls ``pack``. A script that does not use call_begin sets t0, R
# and pack itself.
call_begin() {  # NAME
  t0=$SECONDS
  R=/tmp/$1; mkdir -p "$R"
  eval "pack() { tar czf \"\$OUT/$1.tgz\" -C /tmp $1; }"
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$R/card.txt"; cat "$R/card.txt"
}
gpu_tests() {  # pytest -k SELECTION over the Gluon decode tests
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode_gluon.py \
    -k "$1" > "$R/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $((SECONDS - t0)) s"; tail -n 5 "$R/gpu_tests.log"; pack
}
ab() {  # NAME, then tuning_ab.py's arguments
  local name=$1; shift
  if [ $((SECONDS - t0)) -gt ${UNTIL:-480} ]; then echo "$name: skipped at $((SECONDS - t0)) s"; return; fi
  timeout ${AB_TIMEOUT:-150} python3 benches/kernels/tuning_ab.py "$@" --out "$R/$name" > "$R/$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; grep "RESULT\|disagree\|Error" "$R/$name.log" | tail -n 12; pack
}
