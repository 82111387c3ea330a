#!/usr/bin/env bash
# For a build host without the Debian packages (e.g. an Ubuntu GPU machine with no package
# archive): unpacks the Debian 12 .debs in DIR (apt-get download of spdlog, fmt, CLI11,
# nlohmann-json, xxhash, gtest, libcurl's headers) into PREFIX and prints the environment and
# CMake arguments to use. A development package carried without its runtime (libcurl4-openssl-dev:
# Debian's libcurl4 needs libraries of other sonames than the host's) has its libX.so link
# pointed at the host's own libX.so.N of the same soname. Usage: eval "$(tools/device_deps.sh DEBS_DIR /opt/deps)"
set -euo pipefail
debs=$1; prefix=${2:-/opt/deps}
mkdir -p "$prefix"
for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix"; done
lib=$prefix/usr/lib/x86_64-linux-gnu
# Point the pkg-config and CMake files at the prefix.
sed -i "s|^prefix=/usr|prefix=$prefix/usr|" "$lib"/pkgconfig/*.pc 2>/dev/null || true
for link in "$lib"/*.so; do
  [ -L "$link" ] && [ ! -e "$link" ] || continue
  soname=$(basename "$link").$(readlink "$link" | sed -E 's/.*\.so\.([0-9]+).*/\1/')
  host=$(ldconfig -p | awk -v n="$soname" '$1 == n && /x86-64/ {print $NF; exit}')
  if [ -n "$host" ]; then ln -sfn "$host" "$link"; else echo "device_deps: no host $soname for $link" >&2; fi
done
echo "export PKG_CONFIG_PATH=$lib/pkgconfig; export LD_LIBRARY_PATH=$lib:\${LD_LIBRARY_PATH:-};"
echo "export CMAKE_ARGS=\"-DCMAKE_PREFIX_PATH=$prefix/usr -DCMAKE_INCLUDE_PATH=$prefix/usr/include\";"
