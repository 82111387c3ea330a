#!/usr/bin/env bash
# Short libFuzzer runs of the parsers that read untrusted files: the safetensors header,
# the restricted unpickler, the zip directory reader, a whole PyTorch zip checkpoint, and
# the whole path from file bytes to a laid-out, validated shared-memory segment.
# Builds with clang (ASan + UBSan) in ${FUZZ_BUILD_DIR:-build-fuzz}, starts from the
# committed seeds in tests/fuzz/corpus/<target>/, and runs each target for
# ${FUZZ_SECONDS:-28} seconds (five targets: about the 140 s of four at 35 s).
# Exits non-zero if any target crashes, leaks, hangs or runs out of memory; the input that
# did it is left in <build>/artifacts/<target>/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-28}
targets=(safetensors_header unpickler zip_reader pytorch_zip segment_layout)

"$root/tools/install-deps.sh"
source "$root/tools/ccache_launcher.sh"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCKPT_FUZZ=ON -DCKPT_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

failed=()
for t in "${targets[@]}"; do
  work="$build/corpus/$t"            # grows across runs; the committed seeds stay as they are
  artifacts="$build/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  echo "== fuzzing $t for ${seconds}s"
  if ! "$build/bin/fuzz_$t" "$work" "$root/tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$artifacts" -print_final_stats=1 2>"$build/fuzz_$t.log"; then
    tail -n 40 "$build/fuzz_$t.log"
    failed+=("$t")
  else
    grep -E "^stat::number_of_executed_units|^#.*DONE" "$build/fuzz_$t.log" | tail -n 2 || true
  fi
done
rm -rf /dev/shm/ckptfuzz-*  # the segment_layout target's private segment directories
if ((${#failed[@]})); then
  echo "fuzzing found problems in: ${failed[*]} (inputs in $build/artifacts/)" >&2
  exit 1
fi
echo "fuzzing: no crash in ${targets[*]}"
