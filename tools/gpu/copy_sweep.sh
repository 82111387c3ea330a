#!/usr/bin/env bash
# Copy-engine experiment (issue 14): `ckpt-bench-gpu sweep` over host-path configurations
# on GPU 0, in one process (fast, for choosing defaults; the benchmark's figures come from
# tools/bench_gpu.sh, one process per rank). Writes the 9.88 GiB GPT-Neo-2.7B-shaped
# checkpoint (safetensors only) to ${DATA:-/tmp/ckpt-bench} if missing, loads it into a
# segment on /dev/shm as it is mounted (HUGE=1: remounted huge=always first, set back to
# huge=never at the end; needs root), runs the sweep with CKPT_COPY_TRACE=1.
#   tools/gpu/copy_sweep.sh OUT_DIR [REPS] [CONFIG...]   CONFIG: PATH:STREAMS:CHUNK_MIB:BUFFERS
# SWEEP_DMA=1 first times the DMA side alone (pinned source, 1-4 MiB copies, 8/16 streams).
# Output: OUT_DIR/sweep[-huge].jsonl (runs, then one sweep_summary line per config and TP),
# OUT_DIR/sweep[-huge]-trace.jsonl (each Load's phase timestamps).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?OUT_DIR}; reps=${2:-3}; shift $(( $# >= 2 ? 2 : 1 ))
configs=("$@"); [ ${#configs[@]} -gt 0 ] || configs=(bounce:16:1:2 bounce:16:2:2 bounce:16:2:1 bounce:16:1:3)
bench=${BENCH:-$root/build-gpu/bin/ckpt-bench-gpu}
data=${DATA:-/tmp/ckpt-bench}
py=${PYTHON:-python3}
mkdir -p "$out" "$data"
if [ ! -f "$data/model.safetensors" ]; then
  "$py" -c 'import sys, torch; sys.path.insert(0, sys.argv[1]); import bench_baselines as b; torch.save = lambda *a, **k: None; b.gen(sys.argv[2])' \
    "$root/tools" "$data"
fi
tag=""
if [ "${HUGE:-0}" = 1 ]; then
  tag=-huge
  trap 'mount -o remount,huge=never /dev/shm' EXIT
  mount -o remount,huge=always /dev/shm
fi
shm=ckpt-sweep$tag-$$
"$bench" segment "$data/model.safetensors" $shm
trap '"$bench" unlink '$shm' || true; [ "${HUGE:-0}" = 1 ] && mount -o remount,huge=never /dev/shm || true' EXIT
echo "/dev/shm: $(mount | grep ' /dev/shm ' || true); $(grep -E 'ShmemHugePages' /proc/meminfo | tr -s ' ')"
CKPT_COPY_TRACE=1 "$bench" sweep $shm 0 "$reps" "${WORLDS:-1 2 4}" "${configs[@]}" \
  > "$out/sweep$tag.jsonl" 2> "$out/sweep$tag-trace.jsonl"
grep -E '"what":"sweep_(limit|dma|summary)"' "$out/sweep$tag.jsonl"
