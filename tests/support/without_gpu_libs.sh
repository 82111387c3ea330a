#!/usr/bin/env bash
# without_gpu_libs.sh CMD [ARGS...]: runs CMD where no CUDA runtime, NVIDIA driver or NCCL
# can be loaded. In a private mount namespace (unshare -rm), every libcudart*, libcuda.so*
# and libnccl* file the dynamic linker or a Python wheel could offer is covered by
# /dev/null (dlopen then fails: "file too short"). CKPT_NO_GPU_LIBS=1 tells CMD it runs so.
# Exits 77 (ctest: skipped) where unprivileged mount namespaces are not available.
set -euo pipefail
if [ -z "${CKPT_NO_GPU_LIBS:-}" ]; then
  if ! unshare -rm true 2> /dev/null; then
    echo "skipped: no mount namespace (unshare -rm) to hide the GPU libraries in"
    exit 77
  fi
  exec env CKPT_NO_GPU_LIBS=1 unshare -rm "$0" "$@"
fi
# (Where drivers, toolkits and wheels put them; the dynamic linker's cache points into these.)
roots=(/usr/local /usr/lib /lib /usr/lib64 /lib64 /opt)
IFS=: read -r -a ld_dirs <<< "${LD_LIBRARY_PATH:-}"
for d in "${ld_dirs[@]}"; do [ -n "$d" ] && [ -d "$d" ] && roots+=("$d"); done
hidden=0
while IFS= read -r -d '' f; do
  target=$(readlink -f "$f") || continue
  [ -f "$target" ] || continue
  if mount --bind /dev/null "$target" 2> /dev/null; then hidden=$((hidden + 1)); fi
done < <({ find "${roots[@]}" \( -name 'libcudart.so*' -o -name 'libcuda.so*' -o -name 'libnccl.so*' \) \
              \( -type f -o -type l \) -print0 2> /dev/null
            ldconfig -p 2> /dev/null | awk '/libcudart|libcuda\.so|libnccl/ {printf "%s%c", $NF, 0}'; } | sort -zu)
echo "without_gpu_libs: covered $hidden file(s)" >&2
exec "$@"
