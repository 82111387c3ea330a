#!/usr/bin/env bash
# packages_test.sh BUILD_DIR SOURCE_DIR: issue 13, "the cpack DEB packaging must include"
# what the headers promise. Builds the Debian packages of BUILD_DIR (cpack -G DEB, into a
# scratch directory) and checks that libckptclient-cuda0 carries the GPU plugin (CUDA
# builds), libckpttorch0 libckpttorch and the CMake package's torch component (libtorch
# builds), libckptclient-dev every header and the CMake package, and that no package
# depends on, or ships a file needing, a CUDA or NCCL library.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v dpkg-deb > /dev/null || { echo "skipped: no dpkg-deb"; exit 77; }
(cd "$build" && cpack -G DEB -B "$tmp/out" > "$tmp/cpack.log" 2>&1) || { tail -30 "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb() { ls "$tmp"/out/"$1"_*.deb 2> /dev/null | head -1; }
contents() { dpkg-deb -c "$1" | awk '{print $6}'; }
gpu_libs='nvidia|libcudart|libcuda1|libnccl|cuda-runtime|cuda-toolkit'
for p in ckptd libckptclient0 libckptclient-dev; do [ -n "$(deb $p)" ] || fail "no package $p"; done
for p in "$tmp"/out/*.deb; do
  depends=$(dpkg-deb -f "$p" Depends)
  if grep -Eq "$gpu_libs" <<< "$depends"; then fail "$(basename "$p") depends on a GPU library: $depends"; fi
  dpkg-deb -x "$p" "$tmp/root"
done
while IFS= read -r -d '' f; do
  if readelf -d "$f" 2> /dev/null | grep NEEDED | grep -E 'libcudart|libcuda\.so|libnccl'; then
    fail "${f#"$tmp"/root} needs a GPU library"
  fi
done < <(find "$tmp/root" -type f -name '*.so*' -print0)
echo "ok: $(ls "$tmp"/out/*.deb | wc -l) packages, none needs a CUDA or NCCL library"
dev=$(contents "$(deb libckptclient-dev)")
for h in "$src"/include/ckpt/*.h; do
  grep -q "/include/ckpt/$(basename "$h")$" <<< "$dev" || fail "libckptclient-dev lacks $(basename "$h")"
done
grep -q "/cmake/ckpt/ckptConfig.cmake$" <<< "$dev" || fail "libckptclient-dev lacks the CMake package"
echo "ok: libckptclient-dev has every header and the CMake package"
if [ -e "$build/lib/libckptclient-cuda.so.0" ]; then
  p=$(deb libckptclient-cuda0)
  [ -n "$p" ] || fail "the GPU plugin is built but no libckptclient-cuda0 package"
  grep -q "/libckptclient-cuda.so.0$" <<< "$(contents "$p")" || fail "libckptclient-cuda0 lacks libckptclient-cuda.so.0"
  grep -q "libckptclient0 (= " <<< "$(dpkg-deb -f "$p" Depends)" || fail "libckptclient-cuda0 does not depend on libckptclient0"
  echo "ok: libckptclient-cuda0 has the plugin"
fi
if [ -e "$build/lib/libckpttorch.so.0" ]; then
  p=$(deb libckpttorch0)
  [ -n "$p" ] || fail "libckpttorch is built but no libckpttorch0 package"
  c=$(contents "$p")
  grep -q "/libckpttorch.so.0$" <<< "$c" || fail "libckpttorch0 lacks libckpttorch.so.0"
  grep -q "/cmake/ckpt/ckptTorchTargets.cmake$" <<< "$c" || fail "libckpttorch0 lacks ckpt::ckpttorch (ckptTorchTargets.cmake)"
  echo "ok: libckpttorch0 has the library and the torch component"
fi
