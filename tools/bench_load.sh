#!/usr/bin/env bash
# Load-throughput benchmark of ckptd's loader (docs/benchmarks.md, "Loading a checkpoint into a segment").
#
#   tools/bench_load.sh [MIB] [RUNS] [ckpt-bench-load options...]
#
# Writes a GPT-shaped safetensors checkpoint of about MIB MiB (default 4096) with
# tools/make_checkpoint.py under $BENCH_DIR (default /var/tmp/ckpt-bench; must be on a
# disk, not tmpfs) unless it is there already, builds ckpt-bench-load, prints the machine,
# then measures RUNS times (default 3): cold cache (loader vs dd iflag=direct, cache
# dropped before every measurement; needs root for /proc/sys/vm/drop_caches, else
# posix_fadvise(DONTNEED)) and page cache (loader vs single-threaded read()).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mib=${1:-4096}
runs=${2:-3}
shift $(($# < 2 ? $# : 2))
dir=${BENCH_DIR:-/var/tmp/ckpt-bench}
build=${BUILD_DIR:-$root/build}
mkdir -p "$dir"
file=$dir/gpt-${mib}mib.safetensors
if [[ ! -f $file ]]; then
  /usr/bin/python3 "$root/tools/make_checkpoint.py" "$file" --mib "$mib" --layers 4
fi
[[ -d $build ]] || "$root/tools/build.sh"
cmake --build "$build" --target ckpt-bench-load -j 2 >/dev/null

echo "== machine"
echo "date:    $(date -u +%FT%TZ)"
echo "kernel:  $(uname -r)"
echo "cpus:    $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
echo "memory:  $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min load average before the run)"
fs=$(df --output=source,fstype "$file" | tail -1)
dev=$(basename "$(echo "$fs" | awk '{print $1}')")
rot=$(cat "/sys/block/$dev/queue/rotational" 2>/dev/null || echo "?")
echo "file:    $file on $fs (rotational=$rot; $(cat /sys/block/$dev/device/model 2>/dev/null || echo 'model unknown'))"
echo "command: $build/bin/ckpt-bench-load $file --runs $runs $*"
exec "$build/bin/ckpt-bench-load" "$file" --runs "$runs" "$@"
