#!/usr/bin/env bash
# tools/demo.sh three times, as tools/test.sh (CI) runs it: twice as it is, once pinned to
# CPU 0 beside a busy loop on that CPU. Each run must exit 0 and print its memory summary.
#
#   tests/demo_test.sh ROOT
set -euo pipefail
root=$1
busy=
trap '[[ -n $busy ]] && kill "$busy" 2>/dev/null; true' EXIT
run() {  # run LABEL COMMAND...: one demo run, its output kept and checked
  local label=$1 out rc=0
  shift
  out=$(mktemp /tmp/ckpt-demo-test-XXXXXX.log)
  echo "demo_test: $label"
  "$@" >"$out" 2>&1 || rc=$?
  if ((rc != 0)) || ! grep -q "x the checkpoint (per-rank loading" "$out" || ! grep -q "== ckptd stopped" "$out"; then
    cat "$out"
    echo "demo_test: $label FAILED (exit status $rc)" >&2
    exit 1
  fi
  grep "x the checkpoint" "$out"
  rm -f "$out"
}
run "run 1 of 3" "$root/tools/demo.sh"
run "run 2 of 3" "$root/tools/demo.sh"
taskset -c 0 sh -c 'while :; do :; done' &
busy=$!
run "run 3 of 3, pinned to CPU 0 beside a busy loop" taskset -c 0 "$root/tools/demo.sh"
kill "$busy"
busy=
echo "demo_test: all three runs passed"
