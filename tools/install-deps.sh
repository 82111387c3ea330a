#!/usr/bin/env bash
# Installs the Debian 12 packages that building and testing ckpt needs (as root).
# Skips apt entirely when everything is already installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config ccache
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libxxhash-dev liburing-dev libsystemd-dev libpcre2-dev
  libtorch-dev python3-torch python3-dev pybind11-dev
  clang-14 libclang-rt-14-dev
  systemd passwd util-linux  # systemd-analyze (unit test), useradd, setpriv (access tests)
  debootstrap systemd-container dpkg-dev  # tests/systemd/nspawn_test.sh; cpack's dpkg-shlibdeps
  python3-venv binutils  # tests/python/pip_install_test.sh (venv + pip), tests/client/install_test.sh (readelf, nm)
  python3-packaging python3-tqdm python3-cpuinfo numactl  # DeepSpeed's own needs, for python.deepspeed (docs/deepspeed.md)
  libcurl4-openssl-dev ca-certificates  # remote sources (src/remote/, docs/remote-sources.md)
  nginx-light openssl awscli curl  # remote.sources: nginx (ssl, proxy_cache), a test CA; tools/bench_remote.sh
)
# s3rver (npm) needs node and npm: Debian's, unless a node with npm is already installed
# (a nodesource nodejs carries its own npm and conflicts with Debian's npm package).
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# s3rver, the S3 server of the remote.sources test, into the cache the test reads
# (CKPT_S3RVER in tests/CMakeLists.txt).
s3rver_dir=/var/cache/ckpt-remote-test/s3rver
if [ ! -x "$s3rver_dir/node_modules/.bin/s3rver" ]; then
  mkdir -p "$s3rver_dir"
  npm install --no-audit --no-fund --prefix "$s3rver_dir" s3rver@3
fi
