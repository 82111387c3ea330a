#!/usr/bin/env bash
# Builds and runs tools/gpu/host_path_micro.cu on GPU 0 with the file on 4 KiB pages, then
# on transparent huge pages (/dev/shm remounted huge=always; needs root; set back to
# huge=never at the end).   tools/gpu/host_path_micro.sh [GIB...]   (default: 2.5)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TMPDIR:-/tmp}/host_path_micro
${NVCC:-/usr/local/cuda/bin/nvcc} -O2 -std=c++17 -arch=sm_90 "$here/host_path_micro.cu" -o "$bin" -lpthread
nvidia-smi -L; nproc
trap 'mount -o remount,huge=never /dev/shm' EXIT
for pages in 4k huge; do
  [ $pages = huge ] && mount -o remount,huge=always /dev/shm
  echo "=== $pages pages: $(mount | grep ' /dev/shm ')"
  for g in ${@:-2.5}; do echo "--- $g GiB"; "$bin" "$g"; done
done
