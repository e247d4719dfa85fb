# Sourced by the session run scripts under benches/results/ (repo root): ``ab NAME ARGS...`` runs
# ``benches/kernels/tuning_ab.py ARGS --out $R/NAME`` (log in $R/NAME.log) under ``timeout $AB_TIMEOUT``
# (default 150 s), unless more than $UNTIL seconds (default 480) have passed since $t0; it prints the
# run's RESULT lines and calls the script's ``pack`` (so a call cut short keeps what it made). The
# sourcing script sets t0, R and pack.
ab() {  # NAME, then tuning_ab.py's arguments
  local name=$1; shift
  if [ $((SECONDS - t0)) -gt ${UNTIL:-480} ]; then echo "$name: skipped at $((SECONDS - t0)) s"; return; fi
  timeout ${AB_TIMEOUT:-150} python3 benches/kernels/tuning_ab.py "$@" --out "$R/$name" > "$R/$name.log" 2>&1
  echo "$name rc $? at $((SECONDS - t0)) s"; grep "RESULT\|disagree\|Error" "$R/$name.log" | tail -n 12; pack
}
