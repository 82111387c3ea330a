#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR TORCH_PYTHON: issue 13, "No GPU library at load time"
# and "Install everything the headers promise", on the real build:
#  1. `cmake --install` into a scratch prefix puts there every header, libckptclient, the
#     GPU plugin and libckpttorch when built (with their CMake package parts);
#  2. ldd of libckptclient, libckpttorch and the Python module (built and installed) lists
#     no libcudart, libcuda or libnccl, and the plugin needs none either (readelf);
#  3. a C++ program built with find_package(ckpt) against the prefix attaches, views,
#     shards and partitions through a real ckptd where no GPU library can be loaded
#     (tests/support/without_gpu_libs.sh), and its GPU calls fail naming what is missing;
#     the same with the plugin overridden to a missing path, and with it uninstalled.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) py=$3
tmp=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  rm -rf "$tmp" "/dev/shm/ckptinst$$"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=$tmp/prefix
# Every component, the daemon's too: nothing may land outside the prefix (issue 22: the
# daemon's configuration went to /etc/ckptd whatever the prefix).
for component in client cuda torch dev daemon; do
  cmake --install "$build" --prefix "$prefix" --component $component >> "$tmp/install.log" ||
    { cat "$tmp/install.log"; fail "cmake --install --component $component"; }
done
outside=$(grep -E "^-- (Installing|Up-to-date): " "$tmp/install.log" | grep -v -- "-- [A-Za-z-]*: $prefix/" || true)
[ -z "$outside" ] || fail "installed outside the prefix $prefix: $outside"
[ -f "$prefix/etc/ckptd/ckptd.conf" ] || fail "the daemon component did not install etc/ckptd/ckptd.conf below the prefix"
grep -q "^-- Installing: $prefix/bin/ckptd$" "$tmp/install.log" || fail "the daemon component did not install bin/ckptd"
lib=$(dirname "$(find "$prefix" -name libckptclient.so.0 | head -1)")
[ -e "$lib/libckptclient.so.0" ] || fail "no libckptclient.so.0 installed"
[ -e "$lib/libckptclient.so" ] || fail "no link name libckptclient.so installed"
for h in "$src"/include/ckpt/*.h; do
  [ -f "$prefix/include/ckpt/$(basename "$h")" ] || fail "header $(basename "$h") not installed"
done
for f in ckptConfig.cmake ckptConfigVersion.cmake ckptTargets.cmake; do
  [ -f "$lib/cmake/ckpt/$f" ] || fail "$f not installed"
done
cuda=0 torch=0
[ -e "$build/lib/libckptclient-cuda.so.0" ] && cuda=1
[ -e "$build/lib/libckpttorch.so.0" ] && torch=1
if [ $cuda = 1 ]; then [ -e "$lib/libckptclient-cuda.so.0" ] || fail "the GPU plugin is built but not installed"; fi
if [ $torch = 1 ]; then
  [ -e "$lib/libckpttorch.so.0" ] || fail "libckpttorch is built but not installed"
  [ -f "$lib/cmake/ckpt/ckptTorchTargets.cmake" ] || fail "ckpt::ckpttorch (component torch) not installed"
fi
echo "ok: installed (GPU plugin: $cuda, libckpttorch: $torch)"

gpu_libs='libcudart|libcuda\.so|libnccl'
check_ldd() {
  local f=$1
  [ -e "$f" ] || return 0
  local deps; deps=$(LD_LIBRARY_PATH=$lib ldd "$f") || fail "ldd $f"
  if grep -E "$gpu_libs" <<< "$deps"; then fail "$f depends on a GPU library"; fi
  if grep -q "not found" <<< "$deps"; then echo "$deps"; fail "$f has a missing dependency"; fi
  echo "ok: ldd $(basename "$f"): no GPU library"
}
for f in "$build/lib/libckptclient.so.0" "$build/lib/libckpttorch.so.0" "$build"/python/ckpt/_ckpt*.so \
         "$lib/libckptclient.so.0" "$lib/libckpttorch.so.0"; do
  check_ldd "$f"
done
if [ $cuda = 1 ]; then
  for f in "$build/lib/libckptclient-cuda.so.0" "$lib/libckptclient-cuda.so.0"; do
    if readelf -d "$f" | grep NEEDED | grep -E "$gpu_libs"; then fail "$f needs a GPU library"; fi
    exported=$(nm -D --defined-only "$f" | awk '{print $3}' | grep -v '^$' | sort -u)
    [ "$exported" = "ckpt_gpu_plugin_entry" ] || fail "$f exports more than its entry point: $(head -5 <<< "$exported")"
  done
  echo "ok: the GPU plugin needs no GPU library and exports only ckpt_gpu_plugin_entry"
fi

cmake -S "$src/tests/client/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$tmp/consumer.log" 2>&1 && cmake --build "$tmp/consumer" >> "$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "building a program against the installed package"; }
deps=$(ldd "$tmp/consumer/ckpt-consumer")  # (whole: grep -q under pipefail would SIGPIPE ldd)
grep -qF "$lib/libckptclient.so.0" <<< "$deps" || fail "the program does not use the installed library"
echo "ok: a program built with find_package(ckpt)"
if [ $torch = 1 ]; then
  cmake -S "$src/tests/client/consumer" -B "$tmp/consumer-torch" -DCMAKE_PREFIX_PATH="$prefix" -DCKPT_CONSUMER_TORCH=ON \
    > "$tmp/consumer-torch.log" 2>&1 || { cat "$tmp/consumer-torch.log"; fail "find_package(ckpt COMPONENTS torch)"; }
  echo "ok: find_package(ckpt COMPONENTS torch) gives ckpt::ckpttorch"
fi

"$py" "$src/tools/make_checkpoint.py" "$tmp/gpt.safetensors" --mib 2 --layers 2 > /dev/null
sock=$tmp/ckptd.sock
"$build/bin/ckptd" --socket "$sock" --shm-prefix "ckptinst$$" --state-dir "$tmp/state" --cleanup-on-exit \
  > "$tmp/ckptd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
"$build/bin/ckptctl" --socket "$sock" load "$tmp/gpt.safetensors" --name gpt > /dev/null || fail "ckptctl load"

run_consumer() {  # run_consumer NAME EXPECTED_GPU_ERROR [ENV...]
  local name=$1 want=$2 rc=0
  shift 2
  # The caller's own overrides (run_checks.sh exports CKPT_NCCL_LIBRARY) would change the messages checked.
  env -u CKPT_NCCL_LIBRARY -u CKPT_GPU_PLUGIN "$@" "$src/tests/support/without_gpu_libs.sh" "$tmp/consumer/ckpt-consumer" "$sock" gpt > "$tmp/out" 2>&1 || rc=$?
  [ $rc = 77 ] && { cat "$tmp/out"; exit 77; }
  cat "$tmp/out"
  [ $rc = 0 ] || fail "$name: the program failed (rc $rc)"
  grep -qF -- "gpu-error: $want" "$tmp/out" || fail "$name: the GPU error does not say: $want"
}
if [ $cuda = 1 ]; then
  run_consumer "no driver" "libcuda.so.1 (the NVIDIA driver) could not be loaded"
  grep -qF "nccl-error: libnccl.so.2 not found" "$tmp/out" || fail "the NCCL error does not name libnccl.so.2"
  run_consumer "plugin override" "CKPT_GPU_PLUGIN=$tmp/none/libckptclient-cuda.so.0: no such file" \
    CKPT_GPU_PLUGIN="$tmp/none/libckptclient-cuda.so.0"
  rm "$lib"/libckptclient-cuda.so*
  run_consumer "no plugin" "libckptclient-cuda.so.0 (the CUDA copy engine of libckptclient) not found at $lib/libckptclient-cuda.so.0"
else
  run_consumer "no CUDA build" "libckptclient was built without CUDA"
fi
echo "ok: every check passed"
