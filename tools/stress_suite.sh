#!/usr/bin/env bash
# The suite on a busy machine: the whole ctest run RUNS times in a row (default 10), pinned
# to CPU 0 beside a busy loop on that CPU, with a hostile ckptd configuration in
# /etc/ckptd/ckptd.conf and in the build's own default (<prefix>/etc/ckptd) during run
# HOSTILE_RUN (default 1; 0: none). Prints one line per run and exits non-zero if any test
# failed in any run. Root; run from a built tree (tools/build.sh). Not part of CI (it takes
# RUNS times a pinned suite): its figures go to the issue's note and docs/benchmarks.md.
#
#   tools/stress_suite.sh [RUNS] [CTEST_ARGS...]     BUILD_DIR (default build), HOSTILE_RUN
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
runs=${1:-10}
shift || true
hostile_run=${HOSTILE_RUN:-1}
logs=$(mktemp -d /tmp/ckpt-stress-XXXXXX)
default_conf=$(grep -o 'CKPTD_DEFAULT_CONFIG="[^"]*"' "$build/build.ninja" | head -1 | cut -d'"' -f2 || true)
busy=
saved=()
restore_configs() {
  local f
  for f in "${saved[@]}"; do
    if [[ -e $logs/saved$f ]]; then mv -f "$logs/saved$f" "$f"; else rm -f "$f"; fi
  done
  saved=()
}
trap 'restore_configs; [[ -n $busy ]] && kill "$busy" 2>/dev/null; true' EXIT
hostile() {  # writes a configuration that breaks any daemon that reads it
  local f
  for f in /etc/ckptd/ckptd.conf ${default_conf:+"$default_conf"}; do
    mkdir -p "$(dirname "$f")" "$logs/saved$(dirname "$f")"
    [[ -e $f ]] && cp -p "$f" "$logs/saved$f"
    saved+=("$f")
    cat >"$f" <<'CONF'
# hostile: a test daemon that reads this cannot load anything anywhere
model-root = ["/nonexistent/ckpt-hostile-root"]
memory-budget = "1K"
admin-group = "ckpt-hostile-no-such-group"
socket = "/nonexistent/ckpt-hostile.sock"
CONF
  done
}
taskset -c 0 sh -c 'while :; do :; done' &
busy=$!
failed_runs=0
for ((i = 1; i <= runs; i++)); do
  ((i == hostile_run)) && hostile
  start=$(date +%s)
  rc=0
  (cd "$build" && taskset -c 0 ctest -j2 --timeout 300 --output-on-failure "$@") >"$logs/run$i.log" 2>&1 || rc=$?
  ((i == hostile_run)) && restore_configs
  summary=$(grep -E "tests passed|tests failed" "$logs/run$i.log" | tail -1)
  echo "run $i/$runs$( ((i == hostile_run)) && echo ' (hostile /etc/ckptd/ckptd.conf)'): exit $rc, $(( $(date +%s) - start )) s: $summary"
  if ((rc != 0)); then
    failed_runs=$((failed_runs + 1))
    sed -n '/The following tests FAILED/,$p' "$logs/run$i.log"
  fi
done
echo "stress: $runs runs, $failed_runs with failures (logs in $logs)"
((failed_runs == 0))
