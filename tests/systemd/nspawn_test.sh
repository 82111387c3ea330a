#!/usr/bin/env bash
# The Debian packages under a real systemd: installs ckptd and libckptclient0 into a fresh
# Debian 12 tree (debootstrap), boots it with systemd-nspawn and checks, with systemctl,
# journalctl and the shipped tools run inside the machine (nsenter):
#   - the unit starts and is ready (Type=notify, STATUS=serving ...), not enabled by the
#     package, although a user with no role squatted /dev/shm/ckpt (the segment directory
#     of earlier releases) first; its segments are in the tmpfs /run/ckptd-segments that
#     ExecStartPre= mounted (owner ckptd, mode 0750, huge=within_size where the kernel has
#     shmem THP); a budget above that tmpfs is a warning in the journal;
#   - roles: an admin-group user loads, a reader-group user attaches (ckpt-shard-reader),
#     a user in neither is refused; model roots outside /srv need no drop-in (under /data,
#     under /home with ProtectHome=read-only);
#   - systemctl restart keeps the checkpoints and the attachment: the attached process
#     reads again afterwards and is counted again;
#   - the metrics file (with the documented ReadWritePaths= drop-in) is 0644 and readable
#     by nobody;
#   - a config error (an unknown key; a model root under /tmp, hidden by PrivateTmp=) fails
#     the unit once: exit status 78, NRestarts=0, the cause in the journal;
#   - an upgrade restarts a running ckptd (checkpoints and attachment kept) and enables
#     nothing; apt-get remove stops the service, unmounts /run/ckptd-segments and frees its
#     shared memory; purge removes /etc/ckptd.
#
#   tests/systemd/nspawn_test.sh [ckptd_*.deb libckptclient0_*.deb]     (as root)
#
# Without packages it builds CPU-only ones (tools/package.sh into build-deb-nspawn). The
# debootstrapped base tree and apt's downloads are cached in $CKPT_NSPAWN_CACHE (default
# /var/cache/ckpt-nspawn); each run boots a fresh copy of the base and removes it after.
# Exit status: 0 passed, 1 failed, 77 skipped (not root, or a tool is missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CKPT_NSPAWN_CACHE:-/var/cache/ckpt-nspawn}
mirror=${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECONDS=0

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root (debootstrap, systemd-nspawn)"
for tool in debootstrap systemd-nspawn nsenter python3; do
  command -v "$tool" >/dev/null || skip "no $tool: apt-get install debootstrap systemd-container (tools/install-deps.sh)"
done

step() { printf '== [%3ds] %s\n' "$SECONDS" "$*"; }
machine=ckpt-nspawn-$$
tree=$cache/$machine
work=$(mktemp -d /tmp/ckpt-nspawn-XXXXXX)
nspawn_pid=
leader=
hold=

dump() {
  [[ -n $leader ]] || return 0
  echo "---- journalctl -u ckptd"
  in_machine journalctl -u ckptd --no-pager -n 60 || true
  echo "---- systemctl status ckptd"
  in_machine systemctl status ckptd --no-pager || true
}
fail() {
  echo "FAIL: $*"
  dump
  exit 1
}
cleanup() {
  local rc=$?
  [[ -n $hold ]] && exec {hold}>&- 2>/dev/null
  if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
    [[ -n $leader ]] && in_machine systemctl poweroff >/dev/null 2>&1
    for _ in $(seq 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
    wait "$nspawn_pid" 2>/dev/null || true
  fi
  rm -rf "$tree" "$work"
  if ((rc == 0)); then echo "PASSED in ${SECONDS}s"; fi
}
trap cleanup EXIT

# ---- 1. the packages
debs=("$@")
if ((${#debs[@]} == 0)); then
  step "building CPU-only packages (the tree has no CUDA): tools/package.sh"
  mapfile -t debs < <(PACKAGE_BUILD_DIR=${PACKAGE_BUILD_DIR:-$root/build-deb-nspawn} \
    "$root/tools/package.sh" -DCMAKE_CUDA_COMPILER= -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON 2>"$work/package.log") ||
    { cat "$work/package.log"; fail "tools/package.sh"; }
fi
wanted=()
for deb in "${debs[@]}"; do
  case $(basename "$deb") in ckptd_*.deb | libckptclient0_*.deb) wanted+=("$deb") ;; esac
done
((${#wanted[@]} == 2)) || fail "need ckptd_*.deb and libckptclient0_*.deb, got: ${debs[*]}"

# ---- 2. the base tree (cached)
base=$cache/bookworm
if [[ ! -e $base/.ckpt-complete ]]; then
  step "debootstrap Debian 12 (bookworm) into $base"
  mkdir -p "$cache"
  rm -rf "$base" "$base.tmp"
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,util-linux,passwd bookworm "$base.tmp" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  echo "deb $mirror bookworm main" >"$base.tmp/etc/apt/sources.list"
  touch "$base.tmp/.ckpt-complete"
  mv "$base.tmp" "$base"
fi

# ---- 3. this run's machine: a copy of the base with the packages installed
step "copying the base tree to $tree"
cp -a --reflink=auto "$base" "$tree"
mkdir -p "$cache/apt-archives/partial" "$tree/root/debs"
cp "${wanted[@]}" "$tree/root/debs/"
nspawn_run() {
  systemd-nspawn -q --keep-unit --register=no -D "$tree" --bind="$cache/apt-archives:/var/cache/apt/archives" \
    -E DEBIAN_FRONTEND=noninteractive "$@"
}
step "apt-get install ${wanted[*]##*/} (dependencies from Debian's archive)"
nspawn_run sh -c 'apt-get update -qq && apt-get install -y -q --no-install-recommends /root/debs/*.deb' \
  >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log"; fail "installing the packages"; }
grep -q "systemctl enable --now ckptd" "$work/apt.log" || fail "postinst did not tell the operator how to start ckptd"
chroot "$tree" getent passwd ckptd >/dev/null || fail "postinst did not create the ckptd user"
chroot "$tree" id -nG ckptd | grep -qw ckpt-readers || fail "ckptd is not in ckpt-readers"
chroot "$tree" useradd --no-create-home --groups ckpt-admin bob
chroot "$tree" useradd --no-create-home --groups ckpt-readers alice
chroot "$tree" useradd --no-create-home carol

# A checkpoint in each kind of model root: /srv (the shipped one), /data (no drop-in:
# ProtectSystem=strict leaves it visible, read-only), /home (ProtectHome=read-only).
write_checkpoint() {
  mkdir -p "$(dirname "$1")"
  chmod 755 "$(dirname "$1")"
  python3 - "$1" <<'EOF'
import json, struct, sys
header = json.dumps({"w": {"dtype": "F32", "shape": [8, 8], "data_offsets": [0, 256]}}).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + struct.pack("<64f", *range(64)))
EOF
  chmod 644 "$1"
}
write_checkpoint "$tree/srv/models/tiny.safetensors"
write_checkpoint "$tree/data/models/tiny.safetensors"
write_checkpoint "$tree/home/models/tiny.safetensors"
conf=$tree/etc/ckptd/ckptd.conf
sed -i -e 's|^model-root = .*|model-root = ["/srv/models", "/data/models", "/home/models"]|' \
  -e 's|^memory-budget = .*|memory-budget = "1T"|' \
  -e 's|^# metrics-file = .*|metrics-file = "/var/lib/prometheus/node-exporter/ckptd.prom"|' \
  -e 's|^# metrics-interval = .*|metrics-interval = 1|' "$conf"
cp "$conf" "$work/good.conf"
mkdir -p "$tree/var/lib/prometheus/node-exporter" "$tree/etc/systemd/system/ckptd.service.d"
chroot "$tree" chown ckptd: /var/lib/prometheus/node-exporter
printf '[Service]\nReadWritePaths=/var/lib/prometheus/node-exporter\n' >"$tree/etc/systemd/system/ckptd.service.d/metrics.conf"

# ---- 4. boot
step "booting it: systemd-nspawn --boot --keep-unit --register=no"
systemd-nspawn -q --boot --keep-unit --register=no -D "$tree" --machine="$machine" </dev/null >"$work/boot.log" 2>&1 &
nspawn_pid=$!
for _ in $(seq 200); do
  leader=$(pgrep -P "$nspawn_pid" -x systemd || true)
  [[ -n $leader ]] && break
  sleep 0.1
done
[[ -n $leader ]] || { cat "$work/boot.log"; fail "the container's systemd did not start"; }
in_machine() { nsenter -t "$leader" -a -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
as_user() { local u=$1; shift; in_machine setpriv --reuid "$u" --regid "$u" --init-groups "$@"; }
for _ in $(seq 300); do in_machine test -S /run/systemd/private 2>/dev/null && break; sleep 0.1; done
state=$(timeout 120 nsenter -t "$leader" -a -- /usr/bin/systemctl is-system-running --wait || true)
step "machine booted: $state"
prop() { in_machine systemctl show ckptd -p "$1" --value; }
wait_for() {  # wait_for SECONDS COMMAND...: true once COMMAND succeeds (run again each time)
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do ((SECONDS < deadline)) || return 1; sleep 0.2; done
}
sock=/run/ckptd/ckptd.sock
ctl_json() { in_machine ckptctl --json "$@"; }
attached() {  # attached NAME: the attachment count the daemon reports
  ctl_json list | python3 -c 'import json,sys; print(next((c["attached"] for c in json.load(sys.stdin)["checkpoints"] if c["name"] == sys.argv[1]), -1))' "$1"
}
attached_is() { [[ $(attached "$1") == "$2" ]]; }
lines_at_least() { [[ $(wc -l <"$2") -ge $1 ]]; }
generation() {
  ctl_json list | python3 -c 'import json,sys; print(next((c["generation"] for c in json.load(sys.stdin)["checkpoints"] if c["name"] == sys.argv[1]), -1))' "$1"
}

# ---- 5. start, readiness, journal
[[ $(in_machine systemctl is-enabled ckptd || true) == disabled ]] || fail "the package enabled ckptd"
[[ $(prop ActiveState) == inactive ]] || fail "the package started ckptd"
# carol (no role) squats the old predictable segment directory before the first start.
as_user carol mkdir -m 0777 /dev/shm/ckpt || fail "carol could not create /dev/shm/ckpt"
step "systemctl start ckptd"
in_machine systemctl start ckptd || fail "systemctl start ckptd"
[[ $(prop ActiveState)/$(prop SubState) == active/running ]] || fail "not active/running: $(prop ActiveState)/$(prop SubState)"
# Type=notify: start returned only after READY=1; STATUS= lines come over the same socket.
[[ $(prop Type) == notify ]] || fail "the unit is Type=$(prop Type)"
[[ $(prop StatusText) == "serving on $sock"* || $(prop StatusText) == *" checkpoints, "* ]] ||
  fail "no STATUS= from ckptd: '$(prop StatusText)'"
first_pid=$(prop MainPID)
in_machine journalctl -u ckptd --no-pager >"$work/journal" || true
grep -q "serving on $sock" "$work/journal" || fail "journalctl -u ckptd lacks the daemon's 'serving on' line"
# The default place: /dev/shm/ckpt.<32 random hex>, not carol's /dev/shm/ckpt.
seg=$(ctl_json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["segment_dir"])')
[[ $seg =~ ^/dev/shm/ckpt\.[0-9a-f]{32}$ ]] || fail "ckptd's segment directory is '$seg', not /dev/shm/ckpt.<random>"
[[ $(in_machine stat -c %U:%a "$seg") == ckptd:750 ]] || fail "$seg is $(in_machine stat -c %U:%a "$seg"), not ckptd:750"
grep -q "memory-budget 1.00 TiB (1099511627776 bytes) is larger than $seg" "$work/journal" ||
  fail "no warning for a budget above the segment directory's tmpfs"
[[ $(in_machine stat -c %U /dev/shm/ckpt) == carol ]] || fail "carol's /dev/shm/ckpt was touched"

# ---- 6. roles and model roots
step "admin bob loads from /srv, /data and /home; carol (no group) is refused"
as_user bob ckptctl load /srv/models/tiny.safetensors --name tiny >/dev/null || fail "bob (ckpt-admin) cannot load from /srv/models"
as_user bob ckptctl load /data/models/tiny.safetensors --name data >/dev/null || fail "a model root under /data needs no drop-in, but the load failed"
as_user bob ckptctl load /home/models/tiny.safetensors --name home >/dev/null || fail "a model root under /home (ProtectHome=read-only) failed"
if as_user carol ckptctl load /srv/models/tiny.safetensors --name nope >/dev/null 2>&1; then fail "carol could load"; fi
if as_user carol ckpt-shard-reader "$sock" tiny 0 2 </dev/null >/dev/null 2>&1; then fail "carol could attach"; fi
if as_user alice ckptctl evict tiny >/dev/null 2>&1; then fail "alice (reader) could evict"; fi

step "reader alice attaches with ckpt-shard-reader and stays attached"
mkfifo "$work/hold"
as_user alice ckpt-shard-reader "$sock" tiny 0 2 <"$work/hold" >"$work/reader.out" 2>&1 &
exec {hold}>"$work/hold"
wait_for 20 grep -q "rank 0/2: attached 'tiny'" "$work/reader.out" || fail "alice could not attach: $(cat "$work/reader.out")"
first_line=$(head -n 1 "$work/reader.out")
wait_for 10 attached_is tiny 1 || fail "the daemon does not count alice's attachment: $(attached tiny)"
gen=$(generation tiny)

# ---- 7. restart keeps checkpoints and attachments
step "systemctl restart ckptd"
in_machine systemctl restart ckptd || fail "systemctl restart ckptd"
[[ $(prop ActiveState) == active && $(prop MainPID) != "$first_pid" ]] || fail "not restarted: $(prop ActiveState) pid $(prop MainPID)"
[[ $(generation tiny) == "$gen" && $(generation data) != -1 && $(generation home) != -1 ]] ||
  fail "checkpoints lost across the restart: $(ctl_json list)"
wait_for 15 attached_is tiny 1 || fail "alice's attachment is not counted again after the restart: $(attached tiny)"
echo >&"$hold"  # read the shard again, after the restart
wait_for 10 lines_at_least 2 "$work/reader.out" || fail "the attached reader stopped: $(cat "$work/reader.out")"
[[ $(sed -n 2p "$work/reader.out" | sed 's/ in .* s / /') == "$(sed 's/ in .* s / /' <<<"$first_line")" ]] ||
  fail "the reader read different bytes after the restart: $(cat "$work/reader.out")"
in_machine journalctl -u ckptd --no-pager >"$work/journal" || true
[[ $(grep -c "serving on $sock" "$work/journal") -ge 2 ]] || fail "the journal lacks the restarted daemon's lines"
grep -q "adopted 'tiny' generation" "$work/journal" || fail "the journal does not show the re-adoption"

# ---- 8. metrics file
step "metrics file: mode 0644, readable by nobody"
metrics=/var/lib/prometheus/node-exporter/ckptd.prom
wait_for 10 in_machine test -e "$metrics" || fail "no metrics file (ReadWritePaths= drop-in)"
[[ $(in_machine stat -c %a "$metrics") == 644 ]] || fail "metrics file mode $(in_machine stat -c %a "$metrics")"
in_machine setpriv --reuid nobody --regid nogroup --clear-groups cat "$metrics" | grep -q "^ckptd_up 1" ||
  fail "nobody cannot read the metrics file"

# ---- 8b. an upgrade (here: the same package again) restarts a running ckptd
step "reinstalling ckptd (postinst's upgrade path) restarts it, keeping the checkpoints"
before_pid=$(prop MainPID)
in_machine sh -c 'dpkg -i /root/debs/ckptd_*.deb' >"$work/upgrade.log" 2>&1 || { cat "$work/upgrade.log"; fail "dpkg -i (upgrade)"; }
[[ $(prop ActiveState) == active && $(prop MainPID) != "$before_pid" ]] || fail "the upgrade did not restart ckptd"
[[ $(in_machine systemctl is-enabled ckptd || true) == disabled ]] || fail "the upgrade enabled ckptd"
[[ $(generation tiny) == "$gen" ]] || fail "the upgrade lost the checkpoint"
wait_for 15 attached_is tiny 1 || fail "alice's attachment is not counted after the upgrade: $(attached tiny)"

exec {hold}>&-
hold=
wait_for 10 attached_is tiny 0 || fail "alice's reader did not detach"

# ---- 9. configuration errors fail the unit once
fails_once() {  # fails_once WHAT NEEDLE: the unit failed with 78, was not restarted, journal names NEEDLE
  in_machine systemctl reset-failed ckptd 2>/dev/null || true
  if in_machine systemctl restart ckptd 2>/dev/null; then fail "$1: the unit started"; fi
  sleep 7  # RestartSec=2s: a restart loop would have restarted it by now
  local got
  got="$(prop ActiveState) $(prop Result) $(prop ExecMainStatus) $(prop NRestarts)"
  [[ $got == "failed exit-code 78 0" ]] || fail "$1: want 'failed exit-code 78 0' (state result status restarts), got '$got'"
  # Whole journal first: grep -q stopping early would make journalctl die of SIGPIPE (pipefail).
  in_machine journalctl -u ckptd --no-pager >"$work/journal" || true
  grep -qF "$2" "$work/journal" || fail "$1: the journal does not say '$2'"
  step "$1: failed once with status 78 (NRestarts=0)"
}
step "config errors"
echo 'memry-budget = "1G"' >>"$conf"
fails_once "unknown key" "unknown key 'memry-budget' in /etc/ckptd/ckptd.conf"
cp "$work/good.conf" "$conf"
in_machine install -d -m 755 /tmp/models
in_machine cp /srv/models/tiny.safetensors /tmp/models/
sed -i 's|^model-root = .*|model-root = ["/tmp/models"]|' "$conf"
fails_once "model root under /tmp" "model-root '/tmp/models' does not exist as ckptd sees it (under the ckptd unit, PrivateTmp=yes"
cp "$work/good.conf" "$conf"
in_machine systemctl reset-failed ckptd
in_machine systemctl start ckptd || fail "start with the fixed configuration"
[[ $(generation tiny) == "$gen" ]] || fail "the checkpoint did not survive the failed starts"

# ---- 10. remove and purge
step "apt-get remove ckptd; dpkg --purge ckptd"
[[ -n $(in_machine find "$seg" -user ckptd -type f) ]] || fail "no segments in $seg before the removal"
in_machine env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q ckptd >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "apt-get remove"; }
[[ $(prop ActiveState) != active ]] || fail "ckptd still runs after its removal"
if in_machine mountpoint -q "$seg"; then fail "$seg is still mounted after the removal"; fi
[[ -z $(in_machine find /dev/shm "$seg" -user ckptd 2>/dev/null) ]] || fail "segments left: $(in_machine find /dev/shm "$seg" -user ckptd 2>/dev/null)"
in_machine test -e /etc/ckptd/ckptd.conf || fail "remove deleted the conffile"
in_machine dpkg --purge ckptd >/dev/null || fail "dpkg --purge"
if in_machine test -e /etc/ckptd/ckptd.conf; then fail "purge left /etc/ckptd/ckptd.conf"; fi
step "all checks passed"
