#!/usr/bin/env bash
# tools/bench_remote.sh on the GPU machine (issue 26): its 16 cores leave the servers and
# each client a core of their own, where the dev VM's 2 shared cores make the loopback
# figures a contest for CPU. The machine has no nginx, node or s3rver and no package
# archive: they come from CARRY (default .carry-remote, made on the dev VM):
#   mkdir -p .carry-remote && cd .carry-remote && apt-get download nginx nginx-common
#   xz -3 -c /usr/bin/node > node.xz                       # nodesource's node, libc only
#   tar cf - -C /var/cache/ckpt-remote-test s3rver | xz -3 > s3rver.tar.xz
# and are unpacked under /opt/ckpt-remote. aws (Debian's awscli) does not run there (its
# awscrt is built for Debian's Python): bench_remote.sh skips it. Output: OUT_DIR/remote.log.
# Usage: tools/gpu/remote_bench.sh OUT_DIR [MiB=512] [BUILD_DIR=build-gpu]   (root)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1; mib=${2:-512}; build=${3:-$root/build-gpu}
carry=${CARRY:-$root/.carry-remote}
opt=/opt/ckpt-remote
mkdir -p "$opt/bin" "$out" /var/log/nginx /var/lib/nginx
for d in "$carry"/nginx*.deb; do dpkg -x "$d" "$opt"; done
[ -x "$opt/bin/node" ] || xz -dc "$carry/node.xz" > "$opt/bin/node"
chmod 755 "$opt/bin/node"
[ -d "$opt/s3rver" ] || xz -dc "$carry/s3rver.tar.xz" | tar xf - -C "$opt"
# s3rver's launcher is "#!/usr/bin/env node": node first on PATH.
export PATH=$opt/bin:$opt/usr/sbin:$PATH CKPT_S3RVER=$opt/s3rver/node_modules/.bin/s3rver
{ nproc; node --version; nginx -v 2>&1; curl --version | head -1; } > "$out/remote-machine.txt"
for link in ${CKPT_BENCH_LINKS:-loopback veth}; do  # one run per link: a link this VM lacks (tc) fails alone
  CKPT_BENCH_LINKS=$link "$root/tools/bench_remote.sh" "$mib" "$build" > "$out/remote-$link.log" 2>&1 ||
    echo "bench_remote.sh $link: rc=$?" >> "$out/remote-$link.log"
done
