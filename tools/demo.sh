#!/usr/bin/env bash
# The main job as a demo: one ckptd, one checkpoint in shared memory, several ranks each
# taking its own tensor-parallel slice, and the node's memory against the checkpoint size.
#
#   tools/demo.sh [RANKS] [MIB]      (defaults: 4 ranks, a 512 MiB checkpoint)
#
# Runs as root on a fresh Debian 12 machine: installs what it needs, builds, then uses a
# private socket and shm prefix, so it never touches a ckptd already running. Exits 0 on
# success; on any failure it says which step failed, prints the end of the daemon's log
# and keeps its work directory (the log, the ranks' output) for a look.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-4}
mib=${2:-512}
"$root/tools/install-deps.sh"
build_log=$(mktemp /tmp/ckpt-demo-build-XXXXXX.log)
if ! "$root/tools/build.sh" >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  echo "demo: the build failed (whole log: $build_log)" >&2
  exit 1
fi
rm -f "$build_log"
bin=${BUILD_DIR:-$root/build}/bin

work=$(mktemp -d /tmp/ckpt-demo-XXXXXX)
sock=$work/ckptd.sock
prefix=ckptdemo$$
pids=()
daemon=
hold=
step="starting"
cleanup() {
  local rc=$?
  [[ -n $hold ]] && exec {hold}>&-
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n $daemon ]]; then
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  if ((rc == 0)); then
    rm -rf "$work"
    return
  fi
  echo >&2
  echo "demo: failed while $step (exit status $rc)" >&2
  if [[ -s $work/ckptd.log ]]; then
    echo "demo: the end of the daemon's log ($work/ckptd.log):" >&2
    tail -n 20 "$work/ckptd.log" >&2
  fi
  echo "demo: kept $work for a look (ckptd.log, rank*.out)" >&2
}
trap cleanup EXIT

# Integer arithmetic in bash only: awk (Debian's mawk) prints large sums as 3.61908e+09,
# which bash arithmetic cannot read.
meminfo_bytes() {  # meminfo_bytes KEY: that /proc/meminfo line, in bytes
  local key value unit
  while read -r key value unit; do
    [[ $key == "$1:" ]] && echo $((value * 1024)) && return
  done </proc/meminfo
  echo 0
}
anon_bytes() {  # anon_bytes PID...: the private anonymous memory of those processes, summed
  local total=0 pid key value unit
  for pid in "$@"; do
    while read -r key value unit; do
      [[ $key == Anonymous: ]] && total=$((total + value * 1024))
    done <"/proc/$pid/smaps_rollup"
  done
  echo "$total"
}
# fixed N SCALE DIGITS: N / SCALE with DIGITS decimals (N may be negative).
fixed() {
  local n=$1 scale=$2 digits=$3 sign= unit=1 i
  for ((i = 0; i < digits; i++)); do unit=$((unit * 10)); done
  ((n < 0)) && sign=- && n=$((-n))
  local q=$((n * unit / scale))
  printf '%s%d.%0*d' "$sign" $((q / unit)) "$digits" $((q % unit))
}
mib_of() { echo "$(fixed "$1" 1048576 1) MiB"; }
# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 50 ms; fails naming WHAT after
# SECONDS, or at once if the daemon died. A deadline for a step that never ends, not a race.
wait_until() {
  local seconds=$1 what=$2 i
  shift 2
  for ((i = 0; i < seconds * 20; i++)); do
    "$@" && return 0
    if [[ -n $daemon ]] && ! kill -0 "$daemon" 2>/dev/null; then
      echo "demo: ckptd exited while waiting for $what" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "demo: gave up after ${seconds} s waiting for $what" >&2
  return 1
}
socket_up() { [[ -S $sock ]]; }
rank_ready() {  # rank_ready RANK PID: its line is out; a rank that exited without it fails the demo
  grep -q "rank $1/" "$work/rank$1.out" 2>/dev/null && return 0
  kill -0 "$2" 2>/dev/null && return 1
  echo "demo: rank $1 exited before reading its slice: $(cat "$work/rank$1.out" 2>/dev/null)" >&2
  exit 1
}

step="writing the checkpoint"
echo "== writing a ${mib} MiB GPT-shaped checkpoint with PyTorch"
/usr/bin/python3 "$root/tools/make_checkpoint.py" "$work/gpt.safetensors" --mib "$mib" --layers 8

step="starting ckptd"
echo "== starting ckptd on $sock (shm prefix $prefix)"
# An empty configuration of its own: the demo never reads the node's /etc/ckptd/ckptd.conf.
: >"$work/ckptd.conf"
"$bin/ckptd" --config "$work/ckptd.conf" --socket "$sock" --shm-prefix "$prefix" --state-dir "$work/state" \
  --cleanup-on-exit 2>"$work/ckptd.log" &
daemon=$!
wait_until 60 "ckptd's socket" socket_up
ctl() { "$bin/ckptctl" --socket "$sock" "$@"; }

shmem_before=$(meminfo_bytes Shmem)
step="loading the checkpoint"
echo "== ckptctl load"
ctl load "$work/gpt.safetensors" --name gpt
# Into a file, then the first lines: ckptctl is never cut off mid-write by a closed pipe.
ctl info gpt >"$work/info.txt"
head -n 12 "$work/info.txt"

step="starting the ranks"
echo "== $ranks ranks attach, each reading its own tensor-parallel slice in place"
mkfifo "$work/hold"
for r in $(seq 0 $((ranks - 1))); do
  "$bin/ckpt-shard-reader" "$sock" gpt "$r" "$ranks" <"$work/hold" >"$work/rank$r.out" 2>&1 &
  pids+=($!)
done
exec {hold}>"$work/hold"   # the ranks stay attached while this stays open
for r in $(seq 0 $((ranks - 1))); do
  wait_until 120 "rank $r to read its slice" rank_ready "$r" "${pids[r]}"
  cat "$work/rank$r.out"
done
shmem_during=$(meminfo_bytes Shmem)
ranks_private=$(anon_bytes "${pids[@]}")
ctl list

size=$(ctl --json info gpt | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoint"]["data_bytes"])')
# What this demo's processes hold, not the whole node's memory: a busy machine's other
# processes come and go meanwhile.
shared=$((shmem_during - shmem_before))
used=$((shared + ranks_private))
echo
printf '%-41s%s\n' "checkpoint size:" "$(mib_of "$size")"
printf '%-41s%s\n' "shared memory (Shmem) rose by:" "$(mib_of "$shared") (one copy, every rank attached)"
printf '%-41s%s\n' "the $ranks ranks' private memory:" "$(mib_of "$ranks_private")"
echo "= $(fixed "$used" "$size" 3) x the checkpoint (per-rank loading would need about $ranks x)"
echo

step="detaching the ranks"
exec {hold}>&-
hold=
for p in "${pids[@]}"; do wait "$p"; done
pids=()
step="evicting"
echo "== ckptctl evict"
ctl evict gpt
ctl status
step="stopping ckptd"
kill "$daemon"
wait "$daemon"
daemon=
echo "== ckptd stopped"
