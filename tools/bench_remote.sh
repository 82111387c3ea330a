#!/usr/bin/env bash
# Throughput of a remote load against the usual tools, same servers, same object, same run
# (issue 26; results in docs/benchmarks.md):
#   ckptctl load s3://...    ckptd's ranged GETs straight into a shared-memory segment
#   aws s3 cp                Debian's awscli (/usr/bin/aws), max_concurrent_requests and
#                            multipart_chunksize set (CKPT_BENCH_AWS_REQUESTS, _AWS_CHUNK)
#   curl                     one stream (its natural use) into a /dev/shm file
# against s3rver (node, single-threaded; tools/install-deps.sh installs it), and, to tell a
# client's cost from s3rver's, the same file over plain HTTP from nginx (ckptctl load
# http://... and curl). Everything lands in /dev/shm, so every tool does the same work.
#
# Links (CKPT_BENCH_LINKS, default "loopback veth"):
#   loopback  servers on 127.0.0.1: what each client (and server) costs in CPU
#   veth      servers in their own network namespace behind a veth pair whose server end
#             is shaped by tc tbf to CKPT_BENCH_RATE (default 1gbit) on its egress, the
#             direction the bytes flow; the link's rate is also measured (one TCP stream
#             of a python socket blast, server namespace to client), the denominator of
#             "90% of the link" beside the nominal rate.
# Each link gets CKPT_BENCH_ROUNDS (default 3) rounds of every tool in turn; every figure
# is printed, then a table of medians. Namespace, veth and processes are removed on exit,
# failure included. Needs root (ip netns, tc) for the veth link.
# Usage: tools/bench_remote.sh [MiB=512] [BUILD_DIR=build]
#   CKPT_BENCH_CKPTD_ARGS  extra ckptd options (e.g. "--remote-connections 8")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mib=${1:-512}
build=${2:-$root/build}
links=${CKPT_BENCH_LINKS:-loopback veth}
rate=${CKPT_BENCH_RATE:-1gbit}
rounds=${CKPT_BENCH_ROUNDS:-3}
aws_requests=${CKPT_BENCH_AWS_REQUESTS:-16}
aws_chunk=${CKPT_BENCH_AWS_CHUNK:-8MB}
read -r -a ckptd_extra <<< "${CKPT_BENCH_CKPTD_ARGS:-}"
s3rver=${CKPT_S3RVER:-/var/cache/ckpt-remote-test/s3rver/node_modules/.bin/s3rver}
aws=/usr/bin/aws  # Debian's awscli, not whatever `aws` is first on PATH
py=/usr/bin/python3
ns=ckbench$$ vhost=ckbh$$ vsrv=ckbs$$  # veth names: at most 15 characters
host_ip=10.213.77.1 srv_ip=10.213.77.2
work=$(mktemp -d)
chmod 755 "$work"  # nginx's workers read the file
pids=()
results=()  # "link<TAB>tool<TAB>MiB/s"
stop() {  # stop(pid): TERM, wait for it
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  for p in "${pids[@]}"; do stop "$p"; done
  ip link del "$vhost" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work" /dev/shm/ckpt-bench-aws /dev/shm/ckpt-bench-curl
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 HOME="$work/home"
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY
mkdir -p "$work/s3" "$work/home" "$work/www"

# The object: a safetensors file of 32 float32 tensors (a checkpoint has many; ckptd
# checksums each as its last range lands), random bytes.
$py - "$work/www/model.safetensors" "$mib" <<'EOF'
import json, os, struct, sys
path, mib = sys.argv[1], int(sys.argv[2])
count = 32
n = (mib << 18) // count  # float32 elements per tensor
h = {f"w{i}": {"dtype": "F32", "shape": [n], "data_offsets": [4 * n * i, 4 * n * (i + 1)]} for i in range(count)}
h = json.dumps(h).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for _ in range(4 * n * count >> 20):
        f.write(os.urandom(1 << 20))
EOF
bytes=$(stat -c %s "$work/www/model.safetensors")

free_port() { $py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# in_ns(link, cmd...): becomes the command, in the servers' namespace for the veth link
# (only in a background subshell: `in_ns ... &`, so that $! is the command).
in_ns() { local l=$1; shift; if [ "$l" = veth ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi; }
# start_s3rver(link, ip): s3rver on ip over the shared directory; sets s3port.
start_s3rver() {
  local log="$work/s3rver-$1.log"
  in_ns "$1" "$s3rver" -d "$work/s3" -a "$2" -p 0 --silent --configure-bucket bench > "$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
  s3port=$(grep -o 'listening on [0-9.]*:[0-9]*' "$log" | sed 's/.*://')
  [ -n "$s3port" ] || { echo "s3rver did not start:" >&2; cat "$log" >&2; exit 1; }
}
# start_nginx(link, ip, port): nginx serving $work/www (sendfile, one worker).
start_nginx() {
  local conf="$work/nginx-$1.conf"
  cat > "$conf" <<EOF
user root;
worker_processes 1;
daemon off;
pid $work/nginx-$1.pid;
error_log $work/nginx-$1.err;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $work/nginx-$1-tmp;
  proxy_temp_path $work/nginx-$1-tmp;
  fastcgi_temp_path $work/nginx-$1-tmp;
  uwsgi_temp_path $work/nginx-$1-tmp;
  scgi_temp_path $work/nginx-$1-tmp;
  server { listen $2:$3; root $work/www; }
}
EOF
  in_ns "$1" nginx -c "$conf" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf -o /dev/null -r 0-0 "http://$2:$3/model.safetensors" && return; sleep 0.1; done
  echo "nginx did not start:" >&2; cat "$work/nginx-$1.err" >&2; exit 1
}
setup_veth() {
  ip netns add "$ns"
  ip link add "$vhost" type veth peer name "$vsrv"
  ip link set "$vsrv" netns "$ns"
  ip addr add "$host_ip/24" dev "$vhost"
  ip link set "$vhost" up
  ip -n "$ns" addr add "$srv_ip/24" dev "$vsrv"
  ip -n "$ns" link set "$vsrv" up
  ip -n "$ns" link set lo up
  # Token bucket on the server's egress: long-run rate exactly $rate; burst 10 ms of it
  # (at least 64 KiB, one GSO packet), queue up to 20 ms before drops.
  local burst
  burst=$($py -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'); r=float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]]; print(max(65536, int(r/8*0.01)))")
  tc -n "$ns" qdisc add dev "$vsrv" root tbf rate "$rate" burst "$burst" latency 20ms
  echo "veth: $vhost ($host_ip) <-> $vsrv ($srv_ip, namespace $ns): $(tc -n "$ns" qdisc show dev "$vsrv")"
}
# link_rate(link, ip): MiB/s of one TCP stream of $bytes from the server side (python
# sender, one 4 MiB buffer sent over and over) to this side (recv_into, discarded).
link_rate() {
  local port=$(( 20000 + $$ % 20000 )) sender
  in_ns "$1" $py -c '
import socket, sys
ip, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = bytes(4 << 20)
s = socket.create_server((ip, port))
c, _ = s.accept()
while total > 0:
    total -= c.send(memoryview(buf)[:min(total, len(buf))])
c.close()' "$2" "$port" "$bytes" &
  sender=$!
  $py -c '
import socket, sys, time
ip, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(100):
    try:
        c = socket.create_connection((ip, port)); break
    except OSError:
        time.sleep(0.05)
buf = bytearray(4 << 20); got = 0; t0 = time.monotonic()
while got < total:
    n = c.recv_into(buf)
    if n == 0: break
    got += n
print(f"{got / (1 << 20) / (time.monotonic() - t0):.1f}")' "$2" "$port" "$bytes"
  wait "$sender"
}
# cpu_ticks(pid): user + system time of pid so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# timed(cmd...): runs it (output to the bin), prints "MiB/s CPU-seconds": the CPU is the
# command's (user + system of it and its children) plus the daemon's over the same span
# (what ckptctl asks, the daemon does; it is idle while the other tools run).
timed() {
  local t0 t1 d0 d1 own
  d0=$(cpu_ticks "$daemon")
  t0=$(date +%s.%N)
  "$@" > /dev/null
  t1=$(date +%s.%N)
  d1=$(cpu_ticks "$daemon")
  times > "$work/times"  # this subshell's children, last line: "0m0.030s 0m0.330s"
  own=$(tail -1 "$work/times")
  $py -c "
import re, sys
own = sum(float(m) * 60 + float(s) for m, s in re.findall(r'([0-9]+)m([0-9.]+)s', '$own'))
print(f'{$bytes / 1048576 / ($t1 - $t0):.1f} {own + ($d1 - $d0) / $(getconf CLK_TCK):.2f}')"
}
record() {  # record(link, tool, "MiB/s [CPU-seconds]")
  local rate cpu
  read -r rate cpu <<< "$3"
  results+=("$1"$'\t'"$2"$'\t'"$rate"$'\t'"${cpu:--}")
  printf '%-8s %-34s %8s MiB/s (%.2f s%s)\n' "$1" "$2" "$rate" "$($py -c "print($bytes / 1048576 / $rate)")" \
    "${cpu:+, CPU $cpu s}"
}

if [ -x "$aws" ]; then
  "$aws" configure set default.s3.max_concurrent_requests "$aws_requests"
  "$aws" configure set default.s3.multipart_chunksize "$aws_chunk"
else
  echo "aws: $aws not installed, skipped"
fi
echo "object: $bytes bytes ($mib MiB, 32 tensors); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ckptd extra options: ${ckptd_extra[*]:-(none)}; aws: $([ -x "$aws" ] && "$aws" --version 2>&1 | cut -d' ' -f1 || echo "not installed"), max_concurrent_requests $aws_requests, multipart_chunksize $aws_chunk; curl: $(curl --version | head -1 | cut -d' ' -f1-2)"
for link in $links; do
  case $link in
    loopback) ip=127.0.0.1 ;;
    veth) setup_veth; ip=$srv_ip ;;
    *) echo "unknown link $link (loopback, veth)" >&2; exit 2 ;;
  esac
  start_s3rver "$link" "$ip"
  if [ ! -e "$work/uploaded" ]; then  # one upload; the next link's s3rver reads the same directory
    curl -sf -o /dev/null -T "$work/www/model.safetensors" "http://$ip:$s3port/bench/model.safetensors"
    touch "$work/uploaded"
  fi
  httpport=$([ "$link" = veth ] && echo 8080 || free_port)
  start_nginx "$link" "$ip" "$httpport"
  s3=s3://bench/model.safetensors http=http://$ip:$httpport/model.safetensors
  "$build/bin/ckptd" --socket "$work/ckptd.sock" --shm-prefix ckptbench --state-dir "$work/state-$link" \
    --cleanup-on-exit --remote-allow s3://bench/ --remote-allow "http://$ip:$httpport/" \
    --remote-endpoint "http://$ip:$s3port" --remote-path-style "${ckptd_extra[@]}" > "$work/ckptd-$link.log" 2>&1 &
  daemon=$!
  pids+=($daemon)
  for _ in $(seq 100); do [ -S "$work/ckptd.sock" ] && break; sleep 0.1; done
  ctl() { "$build/bin/ckptctl" --socket "$work/ckptd.sock" "$@"; }
  echo "== $link: s3rver $ip:$s3port, nginx $ip:$httpport"
  for i in $(seq "$rounds"); do
    record "$link" "link (python, one TCP stream)" "$(link_rate "$link" "$ip")"
    record "$link" "ckptctl load s3:// (s3rver)" "$(timed ctl load "$s3" --name bench)"
    ctl evict bench > /dev/null
    if [ -x "$aws" ]; then
      record "$link" "aws s3 cp (s3rver)" "$(timed "$aws" --endpoint-url "http://$ip:$s3port" s3 cp "$s3" /dev/shm/ckpt-bench-aws --quiet)"
      rm -f /dev/shm/ckpt-bench-aws
    fi
    record "$link" "curl (s3rver)" "$(timed curl -sf -o /dev/shm/ckpt-bench-curl "http://$ip:$s3port/bench/model.safetensors")"
    rm -f /dev/shm/ckpt-bench-curl
    record "$link" "ckptctl load http:// (nginx)" "$(timed ctl load "$http" --name bench)"
    ctl evict bench > /dev/null
    record "$link" "curl (nginx)" "$(timed curl -sf -o /dev/shm/ckpt-bench-curl "$http")"
    rm -f /dev/shm/ckpt-bench-curl
  done
  # This link's servers and daemon go; the next link starts its own.
  for p in "${pids[@]}"; do stop "$p"; done
  pids=()
  rm -f "$work/ckptd.sock"
done

echo
echo "medians (MiB/s) of $rounds rounds; nominal $rate = $($py -c "import re; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'); print(f'{float(m[1])*{\"\":1,\"k\":1e3,\"m\":1e6,\"g\":1e9}[m[2]]/8/1048576:.1f}')") MiB/s"
printf '%s\n' "${results[@]}" | $py -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    link, tool, v, cpu = line.rstrip("\n").split("\t")
    rows.setdefault((link, tool), []).append((float(v), cpu))
print("| link | tool | runs (MiB/s) | median | CPU s per run (client, daemon included) |")
print("|---|---|---|---|---|")
for (link, tool), vs in rows.items():
    runs = " / ".join("%.0f" % v for v, _ in vs)
    cpus = " / ".join(c for _, c in vs)
    print(f"| {link} | {tool} | {runs} | {statistics.median(v for v, _ in vs):.0f} | {cpus} |")'
