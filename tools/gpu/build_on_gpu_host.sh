#!/usr/bin/env bash
# Builds ckptd, ckptctl, libckptclient and the Python module on a GPU host that has a
# compiler, CMake, CUDA and PyTorch but no package archive (e.g. Ubuntu 24.04 with pip
# PyTorch). Debian 12 packages of the C++ dependencies are unpacked from DEBS_DIR
# (default .debs, filled on a Debian machine with
#   apt-get download libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev \
#     nlohmann-json3-dev libxxhash-dev libxxhash0 libboost1.74-dev)
# into /opt/ckpt-deps. Prints the environment to use the build afterwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
debs=${DEBS_DIR:-$root/.debs}
deps=/opt/ckpt-deps
build=${BUILD_DIR:-$root/build-gpu}
mkdir -p "$deps"
for f in "$debs"/*.deb; do dpkg -x "$f" "$deps"; done
lib=$deps/usr/lib/x86_64-linux-gnu
# libxxhash.pc names prefix=/usr: point pkg-config at the unpacked tree.
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$deps
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cuda_args=()
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
fi
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS="${CKPT_BUILD_TESTS:-OFF}" \
  -DCMAKE_PREFIX_PATH="$deps/usr;$lib/cmake;$deps/usr/share/cmake;$torch_prefix" \
  -DPython3_EXECUTABLE="$(command -v python3)" "${cuda_args[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH PYTHONPATH=$build/python PATH=$build/bin:\$PATH"
