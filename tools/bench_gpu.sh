#!/usr/bin/env bash
# GPU load benchmark (issue 4), one command on a machine with NVIDIA GPUs and PyTorch:
#   tools/bench_gpu.sh [OUT_DIR] [WORLDS] [PATHS]     e.g. tools/bench_gpu.sh out "1 2 4" "register bounce pageable"
# Builds into ${BUILD_DIR:-build-gpu} (unless SKIP_BUILD=1), writes a GPT-Neo-2.7B-shaped fp32
# checkpoint (9.88 GiB, 420 tensors) to ${DATA:-/tmp/ckpt-bench}, loads it into a shared-memory
# segment, then for each TP degree W starts W processes at once (rank r on GPU r) and prints
# each rank's time from attach to all shards on its GPU, for each host path, next to the
# pinned host->device limit and the safetensors get_slice / torch.load(mmap=True) baselines
# run on the same files in the same run. JSON lines go to OUT_DIR/results.jsonl.
# ALONE=1 runs the W ranks of each TP degree one after another on GPU 0 instead (a machine
# with fewer GPUs than W): each rank's time alone, without the other ranks' contention.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bench-out}
worlds=${2:-1 2 4}
paths=${3:-register bounce pageable}
mkdir -p "$out"
build=${BUILD_DIR:-$root/build-gpu}
data=${DATA:-/tmp/ckpt-bench}
py=${PYTHON:-python3}
ngpu=$(nvidia-smi -L | wc -l)
res=$out/results.jsonl
: > "$res"
: > "$out/trace.jsonl"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ckpt-bench-gpu
fi
bench=$build/bin/ckpt-bench-gpu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
echo "cpus: $(nproc)  mem: $(awk '/MemTotal/{print $2/1048576 " GiB"}' /proc/meminfo)" | tee -a "$out/machine.txt"

mkdir -p "$data"
# The checkpoint; model.pt only where a torch baseline runs (it takes as long again to write).
if [ ! -f "$data/model.safetensors" ] || { [[ "${BASELINES-safetensors torchload torchfull}" == *torch* ]] && [ ! -f "$data/model.pt" ]; }; then
  if [[ "${BASELINES-safetensors torchload torchfull}" == *torch* ]]; then
    "$py" "$root/tools/bench_baselines.py" gen "$data" | tee -a "$res"
  else
    "$py" -c 'import sys, torch; sys.path.insert(0, sys.argv[1]); import bench_baselines as b; torch.save = lambda *a, **k: None; b.gen(sys.argv[2])' \
      "$root/tools" "$data" | tee -a "$res"
  fi
fi
memnow() { awk '/^Shmem:|^AnonPages:/{s+=$2} END{print s*1024}' /proc/meminfo; }
base0=$(memnow)
shm=ckpt-bench-$$
trap '"$bench" unlink $shm || true' EXIT
"$bench" segment "$data/model.safetensors" $shm | tee -a "$res"

start_at() { "$py" -c 'import time; print(f"{time.time() + '"$1"':.3f}")'; }
# limits: each GPU alone, then all at once
"$bench" limit 0 2 | tee -a "$res"
if [ "$ngpu" -gt 1 ]; then
  t=$(start_at 4)
  for g in $(seq 0 $((ngpu - 1))); do "$bench" limit $g 2 $t > "$out/limit.$g" & done; wait
  cat "$out"/limit.* | sed 's/"what":"limit"/"what":"limit_all"/' | tee -a "$res"
fi
# Node memory: peak of Shmem + AnonPages during each group of runs, over the level
# before the segment existed (page cache is not counted).
sample_start() { (peak=0; while :; do m=$(memnow); [ $m -gt $peak ] && peak=$m && echo $peak > "$out/peak"; sleep 0.02; done) & sampler=$!; }
sample_stop() { kill $sampler; wait $sampler 2>/dev/null || true; echo $(( $(cat "$out/peak") - base0 )); }
# configs: path:streams:chunk_MiB:register_threads[:bounce_buffers] (bounce buffers per
# stream, CKPT_COPY_BUFFERS; default 2). TRACE=1: each load's phase timestamps
# (CKPT_COPY_TRACE) go to OUT_DIR/trace.jsonl.
configs=${CONFIGS:-bounce:12:0:1 bounce:16:1:1 register:4:16:1 register:4:16:4 pageable:4:16:1}
alone=${ALONE:-0}
# ranks W START_AT COMMAND...: runs COMMAND RANK W DEVICE START_AT for every rank (all at
# once, rank r on GPU r; or, with ALONE=1, one after another on GPU 0), output in run.RANK.
ranks() {
  local w=$1 t=$2; shift 2
  if [ "$alone" = 1 ]; then
    for r in $(seq 0 $((w - 1))); do "$@" $r $w 0 "$(start_at ${ALONE_LEAD_S:-1})" > "$out/run.$r" 2> "$out/err.$r" || true; done
  else
    local pids=(); for r in $(seq 0 $((w - 1))); do "$@" $r $w $r $t > "$out/run.$r" 2> "$out/err.$r" & pids+=($!); done; wait "${pids[@]}" || true
  fi
  for r in $(seq 0 $((w - 1))); do
    grep -h '^{' "$out/err.$r" 2>/dev/null | sed "s/^{/{\"world\":$w,\"rank\":$r,\"config\":\"${c:-}\",/" >> "$out/trace.jsonl" || true
    grep -hv '^{' "$out/err.$r" >&2 2>/dev/null || true
  done
}
# load RANK WORLD DEVICE START_AT with path P, dtype D, streams ST, chunk CH, threads RT, buffers BU
load() { CKPT_COPY_BUFFERS=${BU:-2} CKPT_COPY_TRACE=${TRACE:-0} "$bench" load $shm $1 $2 $3 $P gpt-neo $D $4 $ST $CH $RT; }
fits() { [ "$1" -le "$ngpu" ] || [ "$alone" = 1 ]; }
for w in $worlds; do
  fits $w || { echo "skip world $w: only $ngpu GPUs"; continue; }
  for c in $configs; do
    IFS=: read P ST CH RT BU <<< "$c"; D=-
    for rep in $(seq ${REPS:-2}); do
      rm -f "$out"/run.*; t=$(start_at ${LEAD_S:-3}); sample_start
      ranks $w $t load
      mem=$(sample_stop)
      cat "$out"/run.* | sed "s/^{/{\"rep\":$rep,\"alone\":$alone,\"node_mem\":$mem,/" | tee -a "$res"
    done
  done
  if [ "${FP16:-1}" = 1 ]; then  # conversion on the GPU, first config's host path
    IFS=: read P ST CH RT BU <<< "${configs%% *}"; D=F16
    rm -f "$out"/run.*; t=$(start_at ${LEAD_S:-3})
    ranks $w $t load
    cat "$out"/run.* | tee -a "$res"
  fi
done
"$bench" unlink $shm
baseline() { "$py" "$root/tools/bench_baselines.py" $B "$F" $1 $2 $4 $3; }
for w in $worlds; do
  fits $w || continue
  for B in ${BASELINES-safetensors torchload torchfull}; do
    F=$data/model.safetensors; [ $B != safetensors ] && F=$data/model.pt
    rm -f "$out"/run.*; t=$(start_at ${PY_LEAD_S:-8}); sample_start
    ranks $w $t baseline
    mem=$(sample_stop)
    cat "$out"/run.* | sed "s/^{/{\"alone\":$alone,\"node_mem\":$mem,/" | tee -a "$res"
  done
done
rm -f "$out"/run.* "$out"/err.* "$out"/limit.* "$out/peak"
"$py" "$root/tools/bench_summary.py" "$res" --plot "$out/gpu_load.png"
