#!/usr/bin/env bash
# The GPU-machine checks in one go: builds everything there (C++ dependencies from the
# Debian .debs in DEBS_DIR, see tools/device_deps.sh; NCCL from PyTorch's nvidia-nccl
# wheel), then runs, each step's log going to OUT_DIR as soon as it ends:
#   gpu       ctest -L gpu (copy engine, collective loads)
#   coll      tools/bench_collective.sh (issue 7)
#   dcp       tools/gpu/check_dcp.py: DCP save/load/async_save on CUDA + timings vs files (issue 15; DCP_MIB)
#   neo       tools/gpu/check_gpt_neo.py, small shape (issue 5; a crash is re-run under cuda-gdb)
#   warm      ckpt-bench-load --mode warm on the 9.88 GiB file (issue 3: page cache vs one thread)
#   repro     tools/repro_host_memory.py, 1..10 ranks (issues 4 and 5)
#   neo27     tools/gpu/check_gpt_neo.py, 2.7B shape
#   pycoll    tools/gpu/check_collective.py (issue 7 from Python; after neo)
#   huge      tools/gpu/huge_pages.sh (issue 4: the segment on 4 KiB vs huge pages)
#   gen       tools/gpu/gen_hf_plans.py (issue 25: the plan data; GEN_TYPES=a,b updates only those), rebuilt
#   hf        tools/gpu/check_hf_families.py (issue 16: every family's "hf" shards and load_model
#             logits against transformers; table in OUT_DIR/hf_families.md; HF_WORLDS="2 4")
#   benchlm   tools/gpu/bench_load_model.py, 2.7B shape (issue 16: load_model vs engine vs
#             from_pretrained; table in OUT_DIR/bench_load_model.md; BENCH_HUGE=1 adds a pass
#             with the segment on huge pages)
#   layout    issue 13: ldd of libckptclient / _ckpt (no libcudart, libnccl), the GPU plugin's
#             NEEDED, the no-GPU-library tests, and a GPU load from Python with PyTorch's own
#             CUDA runtime in the process beside the plugin's static one (OUT_DIR/layout.log)
#   sweep     tools/gpu/copy_sweep.sh (issue 14: copy-engine configurations in one process,
#             4 KiB pages, then huge pages where SWEEP_HUGE=1; SWEEP_CONFIGS, SWEEP_REPS)
#   copy      tools/bench_gpu.sh ALONE=1, TP 1 2 4, default configuration (issue 14: the GPU
#             copy against the pinned limit, one process per rank; COPY_CONFIGS, COPY_REPS)
#   warmhuge  tools/gpu/warm_huge.sh (issue 14: warm loads at 1..16 threads, 4 KiB vs huge
#             pages, against cp and read(); a cold load against dd; table + SVG plot in OUT_DIR)
#   remote    tools/gpu/remote_bench.sh (issue 26: ckptctl load s3:// and http:// against curl on
#             this machine's cores; nginx, node, s3rver carried in .carry-remote)
#   save      tools/gpu/bench_save.py (issue 15: publish from GPU memory vs torch.save and DCP,
#             restores with the page cache dropped; table in OUT_DIR/bench_save.md)
#   tools/gpu/run_checks.sh [OUT_DIR] [STEPS]      STEPS default: "gpu coll neo warm repro neo27"
# BUILD_TARGETS="ckptd ckptctl _ckpt" builds only those (default: everything); BENCH_PREPARE=1
# writes benchlm's model folder in the background while the project builds; HF_FAMILIES=a,b
# limits the hf step to those families, HF_LOGITS_WORLDS its logits check (default HF_WORLDS).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/ckpt-gpu-out}
steps=${2:-gpu coll neo warm repro neo27}
mkdir -p "$out"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }
{
  nvidia-smi -L; nvidia-smi topo -m; nproc; free -g | head -2
  python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.nccl.version())'
  cat /sys/kernel/mm/transparent_hugepage/shmem_enabled; mount | grep -E ' /dev/shm | /tmp ' ; df -h /tmp /dev/shm
} > "$out/machine.txt" 2>&1
eval "$(tools/device_deps.sh "${DEBS_DIR:-.debs}" /opt/ckpt-deps)"
prepare_pid=
if [ "${BENCH_PREPARE:-0}" = 1 ]; then
  python3 tools/gpu/bench_load_model.py --prepare-only --workdir /tmp/neo --shape "${BENCH_SHAPE:-2.7B}" \
    > "$out/bench_prepare.log" 2>&1 &
  prepare_pid=$!
fi
nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
if [ ! -f build-gpu/build.ninja ] || [ "${REBUILD:-1}" = 1 ]; then
  log "build (NCCL_ROOT=$nccl_root)"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release $CMAKE_ARGS -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DPython3_EXECUTABLE="$(command -v python3)" \
    -DCKPT_TORCH_PYTHON="$(command -v python3)" -DNCCL_ROOT="$nccl_root" > "$out/build.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> "$out/build.log" 2>&1 ||
      { log "build failed"; tail -40 "$out/build.log"; exit 1; }
  log "built"
fi
export PYTHONPATH=$root/build-gpu/python
# libckptclient opens NCCL at run time (src/gpu_plugin/nccl_loader.cc): the one already in
# the process (PyTorch's), else this, the wheel's, which is not on the library path.
[ -n "$nccl_root" ] && [ -e "$nccl_root/lib/libnccl.so.2" ] && export CKPT_NCCL_LIBRARY=$nccl_root/lib/libnccl.so.2
data=${DATA:-/tmp/ckpt-bench}
for step in $steps; do
  case $step in
  gpu)
    log "ctest -L gpu"
    ctest --test-dir build-gpu -L gpu --output-on-failure > "$out/gpu_tests.log" 2>&1; log "rc=$?" ;;
  coll)
    log "collective benchmark"
    SKIP_BUILD=1 BUILD_DIR=build-gpu DATA=$data tools/bench_collective.sh "$out" "${COLL_REPS:-2}" > "$out/collective.log" 2>&1
    log "rc=$?" ;;
  neo)
    log "GPT-Neo small"
    { echo "std::regex instantiations exported: _ckpt $(nm -D --defined-only build-gpu/python/ckpt/_ckpt*.so | grep -c regex)," \
        "libtorch_cpu $(nm -D --defined-only "$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))')" | grep -c regex)"; } \
      > "$out/symbols.txt" 2>&1
    python3 -X faulthandler tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo --shape small \
      > "$out/neo_small.log" 2>&1
    rc=$?; log "rc=$rc"
    if [ $rc -ne 0 ]; then
      log "GPT-Neo small again under cuda-gdb"
      pkill -f "ckptd --socket /tmp/neo" ; rm -rf /tmp/neo/*.sock
      timeout 180 cuda-gdb -batch -ex "set pagination off" -ex run -ex "info threads" -ex "thread apply all bt 25" \
        --args python3 tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo --shape small \
        > "$out/neo_small_gdb.log" 2>&1
      log "rc=$?"
    fi ;;
  warm)
    log "warm load vs one thread"
    [ -f "$data/model.safetensors" ] || python3 tools/bench_baselines.py gen "$data" > /dev/null
    build-gpu/bin/ckpt-bench-load "$data/model.safetensors" --mode warm --runs 3 \
      --warm-configs "pread:1,pread:4,pread:8,pread:16" > "$out/warm.log" 2>&1; log "rc=$?" ;;
  repro)
    log "host memory reproduction"
    python3 tools/repro_host_memory.py --workdir /tmp/repro --ranks ${RANKS:-1,2,4,8,10} --modes ${REPRO_MODES:-today,ckptd} --host-path ${HOST_PATH:-bounce} --ckptd build-gpu/bin/ckptd \
      --plot "$out/host_memory.png" --markdown "$out/host_memory.md" > "$out/repro.log" 2>&1
    log "rc=$?" ;;
  pycoll)
    log "collective loads from Python"
    python3 -X faulthandler tools/gpu/check_collective.py --ckptd build-gpu/bin/ckptd \
      --checkpoint /tmp/neo/small/model.safetensors > "$out/pycoll.log" 2>&1; log "rc=$?" ;;
  huge)
    log "huge pages experiment"
    tools/gpu/huge_pages.sh "${HUGE_REPS:-2}" > "$out/huge_pages.log" 2>&1; log "rc=$?" ;;
  gen)
    # tools/gpu/gen_hf_plans.py: the plan data from this machine's transformers (all model
    # types, or --update of GEN_TYPES=a,b), copied to OUT_DIR, then built in (the hf step after
    # it checks the new data).
    log "plan data from transformers ${GEN_TYPES:+(update of $GEN_TYPES)}"
    python3 tools/gpu/gen_hf_plans.py --out src/plan/hf_tp_plans.json --examples tests/python/data/hf_family_examples.json \
      ${GEN_TYPES:+--types "$GEN_TYPES" --update} ${GEN_DEADLINE:+--deadline "$GEN_DEADLINE"} > "$out/gen_hf_plans.log" 2>&1
    log "rc=$?"
    cp src/plan/hf_tp_plans.json tests/python/data/hf_family_examples.json "$out/"
    cmake --build build-gpu -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> "$out/build.log" 2>&1
    log "rebuilt: rc=$?" ;;
  hf)
    log "model families against transformers (CPU/gloo TP, world 1 on the GPU)"
    python3 -X faulthandler tools/gpu/check_hf_families.py --ckptd build-gpu/bin/ckptd --workdir /tmp/hf-families \
      --worlds "$(echo ${HF_WORLDS:-2 4} | tr ' ' ,)" --logits-worlds "$(echo ${HF_LOGITS_WORLDS:-${HF_WORLDS:-2 4}} | tr ' ' ,)" \
      ${HF_FAMILIES:+--families "$HF_FAMILIES"} ${HF_SHARDS:+--shards "$HF_SHARDS"} ${HF_DEADLINE:+--deadline "$HF_DEADLINE"} --out "$out/hf_families.md" > "$out/hf_families.log" 2>&1
    log "rc=$?" ;;
  benchlm)
    log "load_model benchmark, GPT-Neo ${BENCH_SHAPE:-2.7B}"
    [ -n "$prepare_pid" ] && { wait "$prepare_pid"; log "model folder: rc=$?"; prepare_pid=; }
    # BENCH_HUGE=1: a second pass with the segments on a huge=within_size tmpfs given to the
    # daemon as --segment-dir, under /run (only root can create names there; docs/operations.md,
    # "Huge pages"; needs root).
    huge_args=()
    if [ "${BENCH_HUGE:-0}" = 1 ]; then
      mkdir -p /run/benchlmhuge
      if mount -t tmpfs -o "size=${BENCH_HUGE_SIZE:-16G},huge=within_size,mode=0750" tmpfs /run/benchlmhuge; then
        huge_args=(--huge-dir /run/benchlmhuge)
      else
        log "no huge-page tmpfs (mount failed): 4 KiB pages only"
      fi
    fi
    python3 -X faulthandler tools/gpu/bench_load_model.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo \
      --shape "${BENCH_SHAPE:-2.7B}" --reps "${BENCH_REPS:-5}" --markdown "$out/bench_load_model.md" \
      --profile "$out/bench_load_model_profile.txt" "${huge_args[@]}" > "$out/bench_load_model.log" 2>&1
    log "rc=$?"
    [ ${#huge_args[@]} -gt 0 ] && umount /run/benchlmhuge ;;
  layout)
    log "issue 13 layout: no GPU library at load time"
    (
      set -x
      rc=0
      deps=$(ldd build-gpu/lib/libckptclient.so.0 build-gpu/python/ckpt/_ckpt*.so)
      if grep -E 'libcudart|libnccl|libcuda\.so' <<< "$deps"; then echo "FAIL: a GPU library is linked"; rc=1; fi
      readelf -d build-gpu/lib/libckptclient-cuda.so.0 | grep NEEDED
      ls -l build-gpu/lib/libckptclient-cuda.so.0* build-gpu/lib/libckptclient.so.0*
      # (python.no_gpu_libs is not run here: PyTorch's CUDA wheel itself cannot load with them hidden.)
      ctest --test-dir build-gpu -R 'install_no_gpu_libs' --output-on-failure || rc=1
      python3 -X faulthandler tools/gpu/check_layout.py --ckptd build-gpu/bin/ckptd || rc=1
      exit $rc
    ) > "$out/layout.log" 2>&1
    log "rc=$?" ;;
  sweep)
    log "copy engine sweep"
    BENCH=build-gpu/bin/ckpt-bench-gpu DATA=$data tools/gpu/copy_sweep.sh "$out" "${SWEEP_REPS:-3}" ${SWEEP_CONFIGS:-} \
      > "$out/sweep.log" 2>&1; log "rc=$?"
    if [ "${SWEEP_HUGE:-0}" = 1 ]; then
      HUGE=1 BENCH=build-gpu/bin/ckpt-bench-gpu DATA=$data tools/gpu/copy_sweep.sh "$out" "${SWEEP_REPS:-3}" \
        ${SWEEP_CONFIGS:-} >> "$out/sweep.log" 2>&1; log "rc=$?"
    fi ;;
  copy)
    log "GPU copy benchmark, TP 1 2 4, each rank alone"
    SKIP_BUILD=1 BUILD_DIR=build-gpu DATA=$data ALONE=1 ALONE_LEAD_S=${ALONE_LEAD_S:-0.4} REPS=${COPY_REPS:-3} FP16=0 TRACE=1 \
      BASELINES="" CONFIGS="${COPY_CONFIGS:-bounce:12:0:1 bounce:16:1:1}" tools/bench_gpu.sh "$out/copy" "1 2 4" > "$out/copy.log" 2>&1
    log "rc=$?" ;;
  warmhuge)
    log "warm loads, 4 KiB vs huge pages, 1..16 threads; cold against dd"
    tools/gpu/warm_huge.sh "$out" > "$out/warmhuge_run.log" 2>&1; log "rc=$?" ;;
  save)
    log "save benchmark (publish vs torch.save vs DCP)"
    python3 -X faulthandler tools/gpu/bench_save.py --ckptd build-gpu/bin/ckptd --workdir /tmp/save \
      --json "$out/bench_save.jsonl" --markdown "$out/bench_save.md" > "$out/bench_save.log" 2>&1
    log "rc=$?" ;;
  dcp)
    log "DCP (torch.distributed.checkpoint) to and from ckptd, persist, serving cache (issue 15)"
    python3 -X faulthandler tools/gpu/check_dcp.py --ckptd build-gpu/bin/ckptd --workdir /tmp/dcp \
      --mib "${DCP_MIB:-1024}" --markdown "$out/dcp.md" > "$out/dcp.log" 2>&1
    log "rc=$?" ;;
  remote)
    log "remote loads against curl (issue 26)"
    tools/gpu/remote_bench.sh "$out" "${REMOTE_MIB:-512}" > "$out/remote_run.log" 2>&1; log "rc=$?" ;;
  neo27)
    log "GPT-Neo 2.7B"
    python3 tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo --shape 2.7B > "$out/neo_27b.log" 2>&1
    log "rc=$?" ;;
  esac
done
log "done"
