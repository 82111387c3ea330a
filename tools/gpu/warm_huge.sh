#!/usr/bin/env bash
# Issue 14 benchmark, one command, one run: the loader (ckpt-bench-load, the daemon's
# LoadIntoSegment into a published segment) on the 9.88 GiB checkpoint, warm (file in the
# page cache) into a tmpfs with 4 KiB pages (huge=never, what /dev/shm is) and into one
# with huge=within_size, at 1, 2, 4, 8, 16 threads and with the other page-populate
# strategies at 16, against a single-threaded `cp` and a single-threaded read() into a
# fresh shm file and into one buffer; then a cold load (page cache dropped) against
# `dd iflag=direct`. Prints the table, writes OUT/warmhuge.{log,md,svg}. Needs root (mounts
# two private tmpfs under /mnt and unmounts them at the end).
#   tools/gpu/warm_huge.sh OUT        (after run_checks.sh built build-gpu)
# COLD_ONLY=1: only the cold part, on 4 KiB and on huge pages (COLD_RUNS runs each, default
# 1; COLD_CONFIGS, default pread:8, the daemon's default), no plot.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-/tmp/warmhuge}
mkdir -p "$out"
bench=${BENCH:-build-gpu/bin/ckpt-bench-load}
data=${DATA:-/tmp/ckpt-bench}
runs=${RUNS:-2}
file=$data/model.safetensors
mkdir -p "$data"
[ -f "$file" ] || python3 tools/bench_baselines.py gen "$data" > /dev/null || { echo "cannot make $file"; exit 1; }
size=${TMPFS_SIZE:-24g}
mkdir -p /mnt/ckpt-4k /mnt/ckpt-huge
mount -t tmpfs -o size=$size,huge=never,mode=0755 tmpfs /mnt/ckpt-4k || exit 1
mount -t tmpfs -o size=$size,huge=within_size,mode=0755 tmpfs /mnt/ckpt-huge || { umount /mnt/ckpt-4k; exit 1; }
trap 'umount /mnt/ckpt-4k; umount /mnt/ckpt-huge' EXIT
{
  echo "nproc $(nproc)"; lscpu 2>/dev/null | grep -E 'Model name|Socket|NUMA|L3'; ls -d /sys/devices/system/node/node* 2>/dev/null
  echo "shmem_enabled: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
  echo "enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
  grep -E ' /mnt/ckpt-' /proc/self/mountinfo; df -h "$data" | tail -1; uname -r; free -g | head -2
} > "$out/warmhuge_machine.txt" 2>&1
cat "$out/warmhuge_machine.txt"
cfgs=${CONFIGS:-pread:1,pread:2,pread:4,pread:8,pread:16,pread:16:fallocate,pread:16:deferred}
log=$out/warmhuge.log
: > "$log"
if [ "${COLD_ONLY:-0}" = 1 ]; then
  for pages in 4k huge; do
    echo "== cold (page cache dropped), $pages pages" | tee -a "$log"
    "$bench" "$file" --mode cold --runs "${COLD_RUNS:-1}" --segment-root /mnt/ckpt-$pages --tag $pages \
      --cold-configs "${COLD_CONFIGS:-pread:8}" 2>&1 | tee -a "$log" | grep -v '^RESULT'
  done
  exit 0
fi
for pages in 4k huge; do
  echo "== warm, $pages pages" | tee -a "$log"
  "$bench" "$file" --mode warm --runs "$runs" --segment-root /mnt/ckpt-$pages --tag $pages --warm-configs "$cfgs" \
    2>&1 | tee -a "$log" | grep -v '^RESULT'
done
echo "== cold (page cache dropped), huge pages" | tee -a "$log"
"$bench" "$file" --mode cold --runs "${COLD_RUNS:-1}" --segment-root /mnt/ckpt-huge --tag huge \
  --cold-configs "${COLD_CONFIGS:-pread:4,pread:8,pread:16}" 2>&1 | tee -a "$log" | grep -v '^RESULT'
python3 tools/gpu/plot_load.py "$log" --svg "$out/warmhuge.svg" --markdown "$out/warmhuge.md"
cat "$out/warmhuge.md"
