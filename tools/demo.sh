#!/usr/bin/env bash
# The main job as a demo: one ckptd, one checkpoint in shared memory, several ranks each
# taking its own tensor-parallel slice, and the node's memory against the checkpoint size.
#
#   tools/demo.sh [RANKS] [MIB]      (defaults: 4 ranks, a 512 MiB checkpoint)
#
# Runs as root on a fresh Debian 12 machine: installs what it needs, builds, then uses a
# private socket and shm prefix, so it never touches a ckptd already running.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-4}
mib=${2:-512}
"$root/tools/install-deps.sh"
"$root/tools/build.sh" >/dev/null
bin=${BUILD_DIR:-$root/build}/bin

work=$(mktemp -d /tmp/ckpt-demo-XXXXXX)
sock=$work/ckptd.sock
prefix=ckptdemo$$
pids=()
cleanup() {
  exec {hold}>&- 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n ${daemon:-} ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Integer arithmetic in bash only: awk (Debian's mawk) prints large sums as 3.61908e+09,
# which bash arithmetic cannot read.
node_mem() {
  local key value unit total=0
  while read -r key value unit; do
    case $key in Shmem: | AnonPages:) total=$((total + value * 1024)) ;; esac
  done </proc/meminfo
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

echo "== writing a ${mib} MiB GPT-shaped checkpoint with PyTorch"
/usr/bin/python3 "$root/tools/make_checkpoint.py" "$work/gpt.safetensors" --mib "$mib" --layers 8

echo "== starting ckptd on $sock (shm prefix $prefix)"
"$bin/ckptd" --socket "$sock" --shm-prefix "$prefix" --state-dir "$work/state" --cleanup-on-exit 2>"$work/ckptd.log" &
daemon=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
ctl() { "$bin/ckptctl" --socket "$sock" "$@"; }

before=$(node_mem)
echo "== ckptctl load"
ctl load "$work/gpt.safetensors" --name gpt
ctl info gpt | head -n 12

echo "== $ranks ranks attach, each reading its own tensor-parallel slice in place"
mkfifo "$work/hold"
for r in $(seq 0 $((ranks - 1))); do
  "$bin/ckpt-shard-reader" "$sock" gpt "$r" "$ranks" <"$work/hold" >"$work/rank$r.out" &
  pids+=($!)
done
exec {hold}>"$work/hold"   # the ranks stay attached while this stays open
for r in $(seq 0 $((ranks - 1))); do
  until grep -q "rank $r/" "$work/rank$r.out" 2>/dev/null; do sleep 0.05; done
  cat "$work/rank$r.out"
done
during=$(node_mem)
ctl list

size=$(ctl --json info gpt | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoint"]["data_bytes"])')
rise=$((during - before))
echo
echo "checkpoint size:                         $(mib_of "$size")"
echo "node memory (Shmem+AnonPages) rose by:   $(mib_of "$rise") with $ranks ranks attached"
echo "= $(fixed "$rise" "$size" 3) x the checkpoint (per-rank loading would need about $ranks x)"
echo

exec {hold}>&-
wait "${pids[@]}"
pids=()
echo "== ckptctl evict"
ctl evict gpt
ctl status
kill "$daemon"
wait "$daemon"
daemon=
echo "== ckptd stopped"
