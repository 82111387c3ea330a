#!/usr/bin/env bash
# ckptd across containers (issue 26; docs/containers.md). The real ckptd runs here, with
# its own socket directory, shm prefix and state; `ckptctl load` puts a checkpoint written
# by tools/make_checkpoint.py into shared memory. Each client then runs like a container:
# `unshare --mount --pid --fork`, chrooted into a fresh tmpfs root that holds only /usr
# (read-only), this build (read-only, where the client's RPATH points), /dev/null, a
# private empty /dev/shm, its own /proc, no /etc/passwd or /etc/group, and the socket's
# directory bind-mounted at /run/ckptd. It drops to a uid and gid that no passwd or group
# entry names (setpriv --clear-groups). The daemon's reader group is given as a numeric
# gid that names no group (ResolveGroup's all-digit rule).
#   1. the reader gid as primary gid: ckpt-shard-reader --whole reads every tensor in
#      place, and its checksum of the bytes equals the one computed from the file;
#   2. the reader gid only as a supplementary group (setpriv --groups), as a pod's
#      supplementalGroups gives it: read as well (SO_PEERGROUPS);
#   3. a uid and gid outside the group: refused across the namespace.
# Skips (77) unless root with unshare, setpriv and chroot, and PyTorch for the checkpoint.
#
#   tests/integration/containers_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
bin=$build/bin
skip() { echo "containers_test: SKIP: $*"; exit 77; }
fail() { echo "containers_test: FAIL: $*" >&2; exit 1; }
((EUID == 0)) || skip "needs root (mount and pid namespaces, setpriv)"
for t in unshare setpriv chroot mount; do command -v "$t" >/dev/null || skip "no $t"; done
unshare --mount --pid --fork true 2>/dev/null || skip "unshare --mount --pid refused here"
/usr/bin/python3 -c 'import torch' 2>/dev/null || skip "no PyTorch for /usr/bin/python3 (tools/install-deps.sh)"

# Ids that no passwd or group entry names here, as a pod's ids are unknown to the daemon.
reader_gid=61237 uid=61236 sup_uid=61240 sup_gid=61241 out_uid=61238 out_gid=61239
for g in $reader_gid $sup_gid $out_gid; do getent group "$g" >/dev/null && skip "gid $g exists here"; done
for u in $uid $sup_uid $out_uid; do getent passwd "$u" >/dev/null && skip "uid $u exists here"; done

work=$(mktemp -d /tmp/ckpt-containers-XXXXXX)
daemon=
cleanup() {
  local rc=$?
  if [[ -n $daemon ]]; then
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  if ((rc != 0 && rc != 77)) && [[ -s $work/ckptd.log ]]; then
    echo "containers_test: the end of the daemon's log:" >&2
    tail -n 20 "$work/ckptd.log" >&2
  fi
  rm -rf "$work"
  # A daemon that crashed could not clean up its segment directory (--cleanup-on-exit).
  rm -rf /dev/shm/"ckptctr$$".*
}
trap cleanup EXIT
chmod 0755 "$work"
mkdir -m 0755 "$work/sock" "$work/root"
sock=$work/sock/ckptd.sock

/usr/bin/python3 "$src/tools/make_checkpoint.py" "$work/m.safetensors" --mib 1 --layers 2 >/dev/null
# No node configuration: only what this test sets. The socket is world-connectable; the
# daemon checks every peer's uid and groups itself.
printf 'socket-mode = "0666"\nreader-group = "%s"\n' "$reader_gid" >"$work/ckptd.conf"
"$bin/ckptd" --config "$work/ckptd.conf" --socket "$sock" --shm-prefix "ckptctr$$" --state-dir "$work/state" \
  --cleanup-on-exit 2>"$work/ckptd.log" &
daemon=$!
for ((i = 0; i < 400; i++)); do
  [[ -S $sock ]] && break
  kill -0 "$daemon" 2>/dev/null || fail "ckptd exited at start"
  sleep 0.05
done
[[ -S $sock ]] || fail "no socket after 20 s"
"$bin/ckptctl" --socket "$sock" load "$work/m.safetensors" --name m >/dev/null

# The checksum ckpt-shard-reader prints for --whole at world 1 (sum = sum * 31 + byte over
# every tensor's bytes, modulo 2^64), computed from the file, in the daemon's tensor order.
"$bin/ckptctl" --socket "$sock" --json info m >"$work/info.json"
expected=$(/usr/bin/python3 - "$work/m.safetensors" "$work/info.json" <<'EOF'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
info = json.load(open(sys.argv[2]))
tensors = info.get("tensors") or info["checkpoint"]["tensors"]
s, mask = 0, (1 << 64) - 1
for t in tensors:
    a, b = header[t["name"]]["data_offsets"]
    for byte in data[8 + n + a:8 + n + b]:
        s = (s * 31 + byte) & mask
print("%016x" % s)
EOF
)
[[ $expected =~ ^[0-9a-f]{16}$ ]] || fail "no checksum from the file: $expected"

# contained CMD...: CMD in fresh mount and pid namespaces, chrooted into the tmpfs root.
contained() {
  unshare --mount --propagation private --pid --fork /bin/bash -c '
    set -e
    r=$1 build=$2 sockdir=$3
    shift 3
    mount -t tmpfs -o mode=0755,size=4m ctr-root "$r"
    ln -s usr/bin "$r/bin"; ln -s usr/lib "$r/lib"; ln -s usr/lib64 "$r/lib64"; ln -s usr/sbin "$r/sbin"
    mkdir -p "$r/usr" "$r$build" "$r/run/ckptd" "$r/dev/shm" "$r/proc" "$r/etc" "$r/tmp"
    cp /etc/ld.so.cache "$r/etc/"
    for d in /usr "$build"; do mount --bind "$d" "$r$d"; mount -o remount,bind,ro "$r$d"; done
    touch "$r/dev/null"; mount --bind /dev/null "$r/dev/null"
    mount -t tmpfs -o mode=1777,size=1m ctr-shm "$r/dev/shm"
    mount -t proc proc "$r/proc"
    mount --bind "$sockdir" "$r/run/ckptd"
    exec chroot "$r" "$@"
  ' contained "$work/root" "$build" "$work/sock" "$@"
}

# What the client's world looks like: an empty /dev/shm, no passwd/group, no ckptd among
# its processes, no checkpoint file, only the socket under /run/ckptd.
view=$(contained /bin/sh -c 'echo "shm=[$(ls -A /dev/shm)] run=[$(ls -A /run/ckptd)] passwd=$(test -e /etc/passwd && echo yes || echo no)"
  for c in /proc/[0-9]*/comm; do read -r n <"$c" && echo "proc=$n"; done
  test -e '"$work"'/m.safetensors && echo file=visible; true')
echo "containers_test: the client's view: $(echo "$view" | tr '\n' ' ')"
[[ $view == *"shm=[] run=[ckptd.sock] passwd=no"* ]] || fail "the client's root is not as set up: $view"
[[ $view != *"proc=ckptd"* ]] || fail "the daemon is visible in the client's pid namespace"
[[ $view != *"file=visible"* ]] || fail "the checkpoint file is visible to the client"

reader() {  # reader SETPRIV-ARGS...: ckpt-shard-reader --whole in a container, as those ids
  contained /usr/bin/setpriv "$@" -- "$bin/ckpt-shard-reader" /run/ckptd/ckptd.sock m 0 1 --whole </dev/null
}
sum_of() { sed -n 's/.*(sum \([0-9a-f]\{16\}\)).*/\1/p' <<<"$1"; }

# 1. The reader gid as the primary gid.
out=$(reader --reuid=$uid --regid=$reader_gid --clear-groups 2>&1) || fail "reader as primary gid failed: $out"
echo "containers_test: 1. uid $uid gid $reader_gid: $out"
[[ $(sum_of "$out") == "$expected" ]] || fail "checksum $(sum_of "$out") != file's $expected"

# 2. The reader gid only as a supplementary group.
out=$(reader --reuid=$sup_uid --regid=$sup_gid --groups=$reader_gid 2>&1) ||
  fail "reader with the group only as a supplementary group failed: $out"
echo "containers_test: 2. uid $sup_uid gid $sup_gid groups $reader_gid: $out"
[[ $(sum_of "$out") == "$expected" ]] || fail "checksum $(sum_of "$out") != file's $expected"

# 3. Outside the group: refused.
rc=0
out=$(reader --reuid=$out_uid --regid=$out_gid --clear-groups 2>&1) || rc=$?
echo "containers_test: 3. uid $out_uid gid $out_gid: exit $rc: $out"
((rc != 0)) || fail "a peer outside the reader group read the checkpoint"
[[ $out == *"uid $out_uid may not use ckptd: it is in neither the reader nor the admin group"* ]] ||
  fail "refused, but not as an outsider of the reader group: $out"

echo "containers_test: expected checksum $expected; all three cases passed"
