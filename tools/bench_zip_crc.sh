#!/usr/bin/env bash
# What checking zip CRC-32s costs a load (issue 23): a GPT-shaped PyTorch .bin written by
# torch.save, loaded warm (page cache) by the real loader with the checks and without
# them (ckpt-bench-load's nocrc config drops the plan's CRC checks), interleaved in one
# run so that noise hits both. docs/benchmarks.md, "Smaller figures".
#
#   tools/bench_zip_crc.sh [MIB] [RUNS] [THREADS]     (defaults 4096, 5, 16)
#
# The file goes to $BENCH_DIR (default /var/tmp/ckpt-bench); BUILD_DIR as tools/build.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mib=${1:-4096}; runs=${2:-5}; threads=${3:-16}
dir=${BENCH_DIR:-/var/tmp/ckpt-bench}
build=${BUILD_DIR:-$root/build}
mkdir -p "$dir"
file=$dir/gpt-${mib}mib.bin
if [[ ! -f $file ]]; then
  PYTHONPATH="$root/tools" ${CKPT_TORCH_PYTHON:-/usr/bin/python3} - "$file" "$mib" <<'PY'
import sys
import torch
import make_checkpoint
sd = make_checkpoint.gpt_state_dict(float(sys.argv[2]), 4, 0)
torch.save(sd, sys.argv[1])
print(f"wrote {sys.argv[1]}: {len(sd)} tensors")
PY
fi
echo "date:    $(date -u +%FT%TZ)"
echo "cpus:    $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg)"
echo "file:    $file ($(stat -c %s "$file") bytes)"
echo "command: $build/bin/ckpt-bench-load $file --mode warm --runs $runs --warm-configs pread:$threads,pread:$threads:nocrc"
exec "$build/bin/ckpt-bench-load" "$file" --mode warm --runs "$runs" --warm-configs "pread:$threads,pread:$threads:nocrc"
