#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite with ctest.
# GPU tests (label gpu) skip themselves on machines without a GPU. Every optional piece
# (CUDA engine, NCCL, libtorch adapter, Python module) must build: CKPT_OPTIONAL_DEPS=1
# lets a machine without the CUDA toolkit run what it can.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/install-deps.sh"
require=-DCKPT_REQUIRE_ALL=ON
[ "${CKPT_OPTIONAL_DEPS:-0}" = 1 ] && require=-DCKPT_REQUIRE_ALL=OFF
"$root/tools/build.sh" "$require"
cd "${BUILD_DIR:-$root/build}"
ctest -j "$(nproc)" --output-on-failure --timeout 300
# Short fuzz runs of the file parsers (about 2 minutes; exits non-zero on a crash).
"$root/tools/fuzz.sh"
