#!/usr/bin/env bash
# For a build host without the Debian packages (e.g. an Ubuntu GPU machine with no package
# archive): unpacks the Debian 12 .debs in DIR (apt-get download of spdlog, fmt, CLI11,
# nlohmann-json, xxhash, gtest) into PREFIX and prints the environment and
# CMake arguments to use. Usage: eval "$(tools/device_deps.sh DEBS_DIR /opt/deps)"
set -euo pipefail
debs=$1; prefix=${2:-/opt/deps}
mkdir -p "$prefix"
for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix"; done
lib=$prefix/usr/lib/x86_64-linux-gnu
# Point the pkg-config and CMake files at the prefix.
sed -i "s|^prefix=/usr|prefix=$prefix/usr|" "$lib"/pkgconfig/*.pc 2>/dev/null || true
echo "export PKG_CONFIG_PATH=$lib/pkgconfig; export LD_LIBRARY_PATH=$lib:\${LD_LIBRARY_PATH:-};"
echo "export CMAKE_ARGS=\"-DCMAKE_PREFIX_PATH=$prefix/usr -DCMAKE_INCLUDE_PATH=$prefix/usr/include\";"
