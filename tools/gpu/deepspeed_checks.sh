#!/usr/bin/env bash
# Issue 27 on the GPU machine: DeepSpeed (carried as source in .carry-ds/ by
# tools/deepspeed-src/obtain.sh) with and without ckptd. Builds ckptd and the Python module
# (tools/gpu/run_checks.sh's build, BUILD_TARGETS="ckptd _ckpt"), writing the model folders
# meanwhile, then runs STEPS, each with its own time limit, logs and tables in OUT_DIR:
#   probe      versions; import deepspeed
#   cputest    tests/python/test_deepspeed.py (CPU ZeRO-3 / MiCS against DeepSpeed, gloo, torch 2.11)
#   smallinf   inference, GPT-Neo small shape, world 1 on the GPU (a quick end-to-end check)
#   smallz3    ZeRO-3 / MiCS, small bloom, world 1 on the GPU and world 2 on the CPU (SMALLZ3_CPU=0: not)
#   inf        inference, GPT-Neo 2.7B (fp32), world 1 on the GPU          -> deepspeed.md
#   z3         ZeRO-3 / MiCS, bloom-7b1 (fp16), world 1 on the GPU          -> deepspeed.md
#   z3cpu      ZeRO-3 / MiCS, bloom-7b1 widths with 2 layers (bf16), worlds Z3CPU_RANKS (1,2,4)
#              on the CPU with gloo; DeepSpeed as released, DeepSpeed inside
#              ckpt.deepspeed.gathers_waited, ckptd; partitions against the file -> deepspeed.md
#   inftp      inference, GPT-Neo 2.7B (fp32), worlds INF_RANKS (2,4) sharing the one GPU
#              (gloo: NCCL refuses two ranks on one device), AutoTP tp_size = world -> deepspeed.md
#   tools/gpu/deepspeed_checks.sh OUT_DIR "STEPS"
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1; steps=${2:-probe smallinf smallz3 inf z3 z3cpu cputest}
mkdir -p "$out"; cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 DS_BUILD_OPS=0 PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }
work=${WORK:-/tmp/ds}; mkdir -p "$work"
prep() {  # the folders the steps need, in the background while the project builds
  for spec in $steps; do case $spec in
    smallinf) echo inference small ;; smallz3) echo zero3 small ;; inf|inftp) echo inference full ;;
    z3) echo zero3 full ;; z3cpu) echo zero3 layers2 ;; esac; done | while read -r c s; do
      python3 tools/gpu/bench_deepspeed.py --prepare-only --workdir "$work" --case "$c" --shape "$s" || exit 1
    done
}
prep > "$out/prepare.log" 2>&1 & prep_pid=$!
BUILD_TARGETS="ckptd _ckpt" tools/gpu/run_checks.sh "$out/build" none > "$out/build_steps.log" 2>&1 || { log "build failed"; tail -30 "$out/build/build.log"; exit 1; }
log "built"
export PYTHONPATH=$root/.carry-ds:$root/build-gpu/python PATH=/opt/ckpt-deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/ckpt-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
[ -n "$nccl_root" ] && export CKPT_NCCL_LIBRARY=$nccl_root/lib/libnccl.so.2
wait $prep_pid; log "folders: rc=$? $(tail -3 "$out/prepare.log" | tr '\n' ' ')"
bench() { timeout "$1" python3 -X faulthandler tools/gpu/bench_deepspeed.py --ckptd build-gpu/bin/ckptd --workdir "$work" \
  --markdown "$out/deepspeed.md" --json "$out/deepspeed.jsonl" "${@:2}"; }
for step in $steps; do
  case $step in
  probe)
    log "probe"
    { python3 -c 'import torch, transformers, sys; print(sys.version); print(torch.__version__, transformers.__version__)'
      python3 -c 'import time; t=time.time(); import deepspeed, pydantic, hjson; print("deepspeed", deepspeed.__version__, "pydantic", pydantic.VERSION, "hjson", hjson.__version__, f"import {time.time()-t:.1f} s")'
      python3 -c 'import transformers.integrations.deepspeed as d; print("is_deepspeed_available", d.is_deepspeed_available())'
    } > "$out/probe.log" 2>&1; log "rc=$? $(grep -E '^deepspeed|is_deep' "$out/probe.log" | tr '\n' ' ')" ;;
  cputest)
    log "test_deepspeed.py (CPU ZeRO-3 / MiCS against DeepSpeed, gloo)"
    CKPTD_BIN=build-gpu/bin/ckptd CKPT_TOOLS_DIR=$root/tools CKPT_DEEPSPEED_DIR=$root/.carry-ds PYTHONPATH=$root/build-gpu/python \
      timeout 300 python3 tests/python/test_deepspeed.py > "$out/cputest.log" 2>&1; log "rc=$?" ;;
  smallinf) log "inference small"; bench 120 --case inference --shape small > "$out/smallinf.log" 2>&1; log "rc=$?" ;;
  smallz3)
    log "zero3 small"; bench 150 --case zero3 --shape small > "$out/smallz3.log" 2>&1; log "rc=$?"
    [ "${SMALLZ3_CPU:-1}" = 1 ] && { bench 150 --case zero3 --shape small --device cpu --ranks 2 >> "$out/smallz3.log" 2>&1
      log "cpu rc=$?"; } ;;
  inf) log "inference GPT-Neo 2.7B"; bench 300 --case inference --shape full > "$out/inf.log" 2>&1; log "rc=$?" ;;
  z3) log "zero3 bloom-7b1"; bench 400 --case zero3 --shape full > "$out/z3.log" 2>&1; log "rc=$?" ;;
  z3cpu) log "zero3 CPU ranks"; bench "${Z3CPU_LIMIT:-400}" --case zero3 --shape layers2 --device cpu \
           --ranks "${Z3CPU_RANKS:-1,2,4}" --modes deepspeed,deepspeed-waited,ckptd > "$out/z3cpu.log" 2>&1; log "rc=$?" ;;
  inftp) log "inference GPT-Neo 2.7B, ranks sharing the GPU"; bench "${INF_LIMIT:-400}" --case inference --shape full \
           --ranks "${INF_RANKS:-2,4}" > "$out/inftp.log" 2>&1; log "rc=$?" ;;
  esac
done
log done
