#!/usr/bin/env bash
# Configures and builds ckpt into ${BUILD_DIR:-build} (Ninja, RelWithDebInfo by default).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
source "$root/tools/ccache_launcher.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "${launcher[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
