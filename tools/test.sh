#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite with ctest.
# GPU tests (label gpu) skip themselves on machines without a GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/install-deps.sh"
"$root/tools/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest -j "$(nproc)" --output-on-failure --timeout 300
# Short fuzz runs of the file parsers (about 2 minutes; exits non-zero on a crash).
"$root/tools/fuzz.sh"
