#!/usr/bin/env bash
# Builds ckpt's Debian packages (cmake/Packaging.cmake: ckptd, libckptclient0, libckptclient-cuda0 (its GPU plugin, when nvcc is found),
# libckptclient-dev, libckpttorch0 when libtorch is found) in a build directory configured
# for /usr, and prints the paths of the .deb files on stdout.
#
#   tools/package.sh [CMAKE_ARGS...]     e.g. -DCMAKE_CUDA_COMPILER= for packages without
#                                        the CUDA engine (they run on any Debian 12 node)
#
# PACKAGE_BUILD_DIR (default build-deb) is where it builds; tests are not built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PACKAGE_BUILD_DIR:-$root/build-deb}
source "$root/tools/ccache_launcher.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_INSTALL_PREFIX=/usr -DCKPT_CONFIG_DIR=/etc/ckptd -DCKPT_BUILD_TESTS=OFF -DCKPT_PYTHON=OFF "${launcher[@]}" "$@" >&2
cmake --build "$build" -j "$(nproc)" >&2
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB >&2)
ls "$build"/*.deb
