#!/usr/bin/env bash
# GPU checks with binaries built elsewhere (the Debian 12 dev host) and carried in build/
# beside these sources, so that a GPU machine spends no time building (issue 14; the
# device budget is minutes). The binaries hold the absolute source path they were built
# at (the daemon's path for collective_test, tools/, RPATH): BUILT_AT is made a link to
# this tree. Debian's shared libraries come from the .debs in DEBS_DIR (tools/device_deps.sh),
# NCCL from PyTorch's nvidia-nccl wheel, the CUDA runtime from /usr/local/cuda.
#   tools/gpu/prebuilt_checks.sh OUT_DIR BUILT_AT STEPS...
#     datagen    writes the checkpoint (safetensors only) in the background, so that it
#                overlaps the next step (e.g. tests); the steps that read it wait for it
#     tests      gpu_loader_test, collective_test (what ctest -L gpu runs)
#     sweep      tools/gpu/copy_sweep.sh (SWEEP_REPS, SWEEP_CONFIGS, SWEEP_DMA=1)
#     sweephuge  the same with /dev/shm on huge pages (HUGE=1; SWEEPHUGE_CONFIGS)
#     copyhuge   copy with /dev/shm remounted huge=always (needs root; set back to huge=never)
#     copyold    the same with the binaries in build-old/ (an earlier engine, built and carried
#                the same way): before and after in one run
#     copy       tools/bench_gpu.sh ALONE=1 "1 2 4" (COPY_CONFIGS, COPY_REPS, COPY_WORLDS): the figures
#     copyvar    the same for each of COPY_VARIANTS="NAME/CONFIG/WORLDS/VAR=VAL,VAR=VAL ..." (the
#                engine's experiment knobs, e.g. CKPT_COPY_SPANS=0; WORLDS like 1+4;
#                VAR_REPS repetitions; VAR_HUGE=1: /dev/shm remounted huge=always for them):
#                A/B in one run, output in var-NAME/
#     cold       tools/gpu/warm_huge.sh COLD_ONLY=1: cold loads (page cache dropped) against
#                dd iflag=direct, 4 KiB and huge pages (COLD_RUNS, COLD_CONFIGS; needs root)
# Logs go to a scratch directory, packed into OUT_DIR/results.tgz after every step (a
# command stopped at its time limit still returns what finished); OUT_DIR/summary.txt
# holds the step lines and each step's headline.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1; built_at=$2; shift 2
work=${WORK_DIR:-$(mktemp -d)}; mkdir -p "$work"
mkdir -p "$out" "$(dirname "$built_at")"
[ -e "$built_at" ] || ln -s "$root" "$built_at"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log() { echo "[$(date +%T)] $*" | tee -a "$out/summary.txt"; }
pack() { tar -czf "$out/results.tgz" -C "$work" . 2>/dev/null || true; }
eval "$(tools/device_deps.sh "${DEBS_DIR:-../.debs}" /opt/ckpt-deps)"
nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
cudart=$(dirname "$(find /usr/local/cuda*/ -name 'libcudart.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH=$root/build/lib:$nccl:${cudart:-/usr/local/cuda/lib64}:$LD_LIBRARY_PATH
{
  nvidia-smi -L; nproc; free -g | head -2; uname -r
  cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled
  mount | grep -E ' /dev/shm ' ; ldd build/bin/ckpt-bench-gpu | grep -E 'not found|cudart|nccl|ckpt'
} > "$work/machine.txt" 2>&1
grep -q 'not found' "$work/machine.txt" && log "missing libraries: $(grep 'not found' "$work/machine.txt" | tr -s ' \n' ' ')"
data=${DATA:-/tmp/ckpt-bench}
gen_pid=
wait_data() { [ -n "$gen_pid" ] && { wait "$gen_pid"; log "checkpoint written: rc=$?"; gen_pid=; }; true; }
for step in "$@"; do
  case $step in
  datagen)
    mkdir -p "$data"
    if [ ! -f "$data/model.safetensors" ]; then
      log "writing the checkpoint in the background"
      python3 -c 'import sys, torch; sys.path.insert(0, sys.argv[1]); import bench_baselines as b; torch.save = lambda *a, **k: None; b.gen(sys.argv[2])' \
        "$root/tools" "$data" > "$work/datagen.log" 2>&1 &
      gen_pid=$!
    fi ;;
  tests)
    log "gpu_loader_test"
    # (In OUT_DIR itself, so that a run stopped at its limit still returns it; a hang is cut.)
    timeout ${TESTS_TIMEOUT_S:-120} build/bin/gpu_loader_test > "$out/gpu_loader_test.log" 2>&1; rc=$?
    cp "$out/gpu_loader_test.log" "$work/"; log "rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu_loader_test.log" | tr '\n' ' ')"
    log "collective_test"
    # Its checkpoints are written by the Python the binary was built with (CKPT_TORCH_PYTHON,
    # /usr/bin/python3 on the dev host). Where that one has no torch here, the test cannot
    # run: say so rather than trick the path (a wrapper bound over /usr/bin/python3 loops
    # where the PATH python3 is a venv linking back to it: it hung a run).
    if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
      timeout 60 build/bin/collective_test > "$work/collective_test.log" 2>&1; rc=$?
      log "rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$work/collective_test.log" | tr '\n' ' ')"
    else
      log "collective_test not run: /usr/bin/python3 has no torch here"
    fi ;;
  sweep|sweephuge)
    wait_data
    log "$step"
    h=0; cfg=${SWEEP_CONFIGS:-}; [ $step = sweephuge ] && h=1 && cfg=${SWEEPHUGE_CONFIGS:-$cfg}
    HUGE=$h BENCH=${SWEEP_BENCH:-build/bin/ckpt-bench-gpu} DATA=$data tools/gpu/copy_sweep.sh "$work" "${SWEEP_REPS:-3}" $cfg \
      > "$work/$step.log" 2>&1; rc=$?
    log "rc=$rc"; grep -E 'sweep_(limit|dma|summary)|rror' "$work/$step.log" >> "$out/summary.txt" ;;
  copy)
    wait_data
    log "bench_gpu.sh ALONE=1"
    SKIP_BUILD=1 BUILD_DIR=$root/build DATA=$data ALONE=1 ALONE_LEAD_S=${ALONE_LEAD_S:-0.5} REPS=${COPY_REPS:-3} FP16=0 \
      TRACE=1 BASELINES="" CONFIGS="${COPY_CONFIGS:-bounce:12:0:1 bounce:16:1:1}" tools/bench_gpu.sh "$work/copy" "${COPY_WORLDS:-1 2 4}" > "$work/copy.log" 2>&1
    log "rc=$?"; grep -E '^\||pinned' "$work/copy.log" >> "$out/summary.txt" ;;
  copyvar)
    wait_data
    [ "${VAR_HUGE:-0}" = 1 ] && { mount -o remount,huge=always /dev/shm && log "variants on huge pages" || log "cannot remount /dev/shm"; }
    for v in ${COPY_VARIANTS:-}; do
      IFS=/ read -r name cfg worlds envs <<< "$v"
      log "variant $name: $cfg TP ${worlds//+/ } ${envs:-(defaults)}"
      (
        IFS=, read -r -a kv <<< "${envs:-}"
        for e in "${kv[@]}"; do export "$e"; done
        SKIP_BUILD=1 BUILD_DIR=$root/build DATA=$data ALONE=1 ALONE_LEAD_S=${ALONE_LEAD_S:-0.5} REPS=${VAR_REPS:-2} FP16=0 \
          TRACE=1 BASELINES="" CONFIGS="$cfg" tools/bench_gpu.sh "$work/var-$name" "${worlds//+/ }"
      ) > "$work/var-$name.log" 2>&1
      log "rc=$?"; grep -E '^\||pinned' "$work/var-$name.log" >> "$out/summary.txt"
      pack
    done
    [ "${VAR_HUGE:-0}" = 1 ] && mount -o remount,huge=never /dev/shm ;;
  cold)
    wait_data
    log "cold loads against dd iflag=direct, 4 KiB and huge pages"
    COLD_ONLY=1 BENCH=$root/build/bin/ckpt-bench-load DATA=$data timeout ${COLD_TIMEOUT_S:-600} tools/gpu/warm_huge.sh "$work/cold" \
      > "$work/cold.log" 2>&1
    log "rc=$?"; grep -E '^== |dd bs|x dd' "$work/cold.log" >> "$out/summary.txt" ;;
  copyhuge)
    wait_data
    log "bench_gpu.sh ALONE=1, segment on huge pages (/dev/shm huge=always)"
    if mount -o remount,huge=always /dev/shm; then
      SKIP_BUILD=1 BUILD_DIR=$root/build DATA=$data ALONE=1 ALONE_LEAD_S=${ALONE_LEAD_S:-0.5} REPS=${COPY_REPS:-3} FP16=0 \
        TRACE=1 BASELINES="" CONFIGS="${COPYHUGE_CONFIGS:-bounce:12:0:1}" tools/bench_gpu.sh "$work/copyhuge" "${COPY_WORLDS:-1 2 4}" \
        > "$work/copyhuge.log" 2>&1; rc=$?
      grep -E 'ShmemHugePages|ShmemPmdMapped' /proc/meminfo >> "$work/copyhuge.log"
      mount -o remount,huge=never /dev/shm
      log "rc=$rc"; grep -E '^\||pinned' "$work/copyhuge.log" >> "$out/summary.txt"
    else
      log "cannot remount /dev/shm"
    fi ;;
  copyold)
    wait_data
    [ -x build-old/bin/ckpt-bench-gpu ] || { log "no build-old/bin/ckpt-bench-gpu"; continue; }
    log "bench_gpu.sh ALONE=1, earlier engine (build-old)"
    LD_LIBRARY_PATH=$root/build-old/lib:$LD_LIBRARY_PATH SKIP_BUILD=1 BUILD_DIR=$root/build-old DATA=$data ALONE=1 \
      ALONE_LEAD_S=${ALONE_LEAD_S:-0.5} REPS=${COPY_REPS:-3} FP16=0 BASELINES="" CONFIGS="bounce:16:0:1" \
      tools/bench_gpu.sh "$work/copyold" "1 2 4" > "$work/copyold.log" 2>&1
    log "rc=$?"; grep -E '^\||pinned' "$work/copyold.log" >> "$out/summary.txt" ;;
  esac
  pack
done
log done
pack
