#!/usr/bin/env bash
# The GPU-machine checks of issues 4 and 5 in one go: builds everything there (C++
# dependencies from Debian .debs in DEBS_DIR, see tools/device_deps.sh), runs the ctest
# label gpu, the GPT-Neo checks (small and 2.7B shapes) and the host-memory reproduction
# for 1, 2, 4, 8 and 10 ranks. Results and logs go to OUT_DIR (default /tmp/ckpt-gpu-out),
# each step's as soon as it ends.
#   tools/gpu/run_checks.sh [OUT_DIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/ckpt-gpu-out}
mkdir -p "$out"
cd "$root"
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }
{
  nvidia-smi -L; nproc; free -g | head -2; python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'
} > "$out/machine.txt" 2>&1
eval "$(tools/device_deps.sh "${DEBS_DIR:-.debs}" /opt/ckpt-deps)"
log "build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release $CMAKE_ARGS -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DPython3_EXECUTABLE="$(command -v python3)" \
  -DCKPT_TORCH_PYTHON="$(command -v python3)" > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" >> "$out/build.log" 2>&1 || { log "build failed"; tail -40 "$out/build.log"; exit 1; }
export PYTHONPATH=$root/build-gpu/python
log "ctest -L gpu"
ctest --test-dir build-gpu -L gpu --output-on-failure > "$out/gpu_tests.log" 2>&1; log "ctest rc=$?"
log "GPT-Neo small"
python3 tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo --shape small > "$out/neo_small.log" 2>&1
log "rc=$?"
log "host memory reproduction"
python3 tools/repro_host_memory.py --workdir /tmp/repro --ranks 1,2,4,8,10 --ckptd build-gpu/bin/ckptd \
  --plot "$out/host_memory.png" --markdown "$out/host_memory.md" > "$out/repro.log" 2>&1
log "rc=$?"
log "GPT-Neo 2.7B"
python3 tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo --shape 2.7B > "$out/neo_27b.log" 2>&1
log "rc=$?"
log "done"
