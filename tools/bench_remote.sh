#!/usr/bin/env bash
# Throughput of a remote load against the usual tools, same server, same run (issue 26):
#   ckptctl load s3://...   (ckptd's ranged GETs straight into shared memory)
#   aws s3 cp               (Debian's awscli, max_concurrent_requests tuned) to /dev/shm
#   curl                    (one stream) to /dev/null
# against s3rver on 127.0.0.1 (tools/install-deps.sh installs it). A loopback figure says
# how much CPU each client spends per byte more than what a link allows; s3rver (node) is
# itself often the limit.
# Usage: tools/bench_remote.sh [MiB=512] [BUILD_DIR=build]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mib=${1:-512}
build=${2:-$root/build}
s3rver=${CKPT_S3RVER:-/var/cache/ckpt-remote-test/s3rver/node_modules/.bin/s3rver}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work" /dev/shm/ckpt-bench-cp; }
trap cleanup EXIT
mkdir -p "$work/s3" "$work/home"
"$s3rver" -d "$work/s3" -a 127.0.0.1 -p 0 --silent --configure-bucket bench > "$work/s3.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/s3.log" && break; sleep 0.1; done
port=$(grep -o 'listening on [0-9.]*:[0-9]*' "$work/s3.log" | sed 's/.*://')
[ -n "$port" ] || { echo "s3rver did not start"; exit 1; }
/usr/bin/python3 - "$work/model.safetensors" "$mib" <<'EOF'
import json, os, struct, sys
path, mib = sys.argv[1], int(sys.argv[2])
n = mib << 18  # float32 elements
h = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for _ in range(mib):
        f.write(os.urandom(1 << 20))
EOF
curl -s -o /dev/null -T "$work/model.safetensors" "http://127.0.0.1:$port/bench/model.safetensors"
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 HOME="$work/home"
env -u http_proxy -u https_proxy "$build/bin/ckptd" --socket "$work/ckptd.sock" --shm-prefix ckptbench --state-dir "$work/state" \
  --cleanup-on-exit --remote-allow s3://bench/ --remote-endpoint "http://127.0.0.1:$port" --remote-path-style \
  > "$work/ckptd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/ckptd.sock" ] && break; sleep 0.1; done
rate() { /usr/bin/python3 -c "import sys; print(f'{$mib/float(sys.argv[1]):.0f} MiB/s ({float(sys.argv[1]):.2f} s)')" "$1"; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); /usr/bin/python3 -c "print($t1-$t0)"; }
echo "object: $mib MiB on s3rver 127.0.0.1:$port"
for i in 1 2; do
  "$build/bin/ckptctl" --socket "$work/ckptd.sock" evict bench >/dev/null 2>&1 || true
  echo "ckptctl load s3:// (run $i): $(rate "$(secs "$build/bin/ckptctl" --socket "$work/ckptd.sock" --json load s3://bench/model.safetensors --name bench)")"
  aws configure set default.s3.max_concurrent_requests 16
  aws configure set default.s3.multipart_chunksize 8MB
  echo "aws s3 cp, 16 requests (run $i): $(rate "$(secs aws --endpoint-url "http://127.0.0.1:$port" s3 cp s3://bench/model.safetensors /dev/shm/ckpt-bench-cp --quiet)")"
  rm -f /dev/shm/ckpt-bench-cp
  echo "curl, one stream (run $i): $(rate "$(secs curl -s -o /dev/null "http://127.0.0.1:$port/bench/model.safetensors")")"
done
