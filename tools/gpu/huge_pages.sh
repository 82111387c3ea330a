#!/usr/bin/env bash
# Issue 4 experiment: GPU load of the 9.88 GiB checkpoint with its segment on 4 KiB pages
# against the same on transparent huge pages (/dev/shm remounted huge=always; needs root,
# restored to huge=never at the end), in the same run: TP = number of GPUs, all ranks at
# once, bounce (8 and 16 streams) and register (4 threads) host paths, REPS repetitions.
#   tools/gpu/huge_pages.sh [REPS]       (after run_checks.sh built build-gpu)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bench=build-gpu/bin/ckpt-bench-gpu
data=${DATA:-/tmp/ckpt-bench}
reps=${1:-2}
ngpu=$(nvidia-smi -L | wc -l)
start_at() { python3 -c 'import time; print(f"{time.time() + '"$1"':.3f}")'; }
trap 'mount -o remount,huge=never /dev/shm' EXIT
for pages in 4k huge; do
  if [ $pages = huge ]; then mount -o remount,huge=always /dev/shm || { echo "cannot remount /dev/shm"; exit 1; }; fi
  echo "== $pages pages: $(mount | grep ' /dev/shm ')"
  shm=ckpt-hp-$pages-$$
  "$bench" segment "$data/model.safetensors" $shm
  grep -E 'ShmemHugePages|ShmemPmdMapped' /proc/meminfo
  for rep in $(seq "$reps"); do
    for cfg in bounce:8:16:1 bounce:16:16:1 register:4:32:4 register:8:32:8; do
      IFS=: read p st ch rt <<< "$cfg"
      t=$(start_at 3); pids=()
      for r in $(seq 0 $((ngpu - 1))); do "$bench" load $shm $r $ngpu $r $p gpt-neo - $t $st $ch $rt > /tmp/hp.$r & pids+=($!); done
      wait "${pids[@]}"
      for r in $(seq 0 $((ngpu - 1))); do sed "s/^{/{\"pages\":\"$pages\",\"rep\":$rep,/" /tmp/hp.$r; done
    done
  done
  "$bench" unlink $shm
done
