#!/usr/bin/env bash
# Collective load benchmark (issue 7), one command on a machine with 2 or more NVLinked GPUs:
#   tools/bench_collective.sh [OUT_DIR] [REPS]
# Builds ckpt-bench-gpu into ${BUILD_DIR:-build-gpu} (unless SKIP_BUILD=1), writes the
# GPT-Neo-2.7B-shaped fp32 checkpoint (9.88 GiB) to ${DATA:-/tmp/ckpt-bench} unless there,
# loads it into a shared-memory segment, then with all N GPUs at once (rank r on GPU r):
#   replica: every rank loads the whole checkpoint: independent copies vs collective;
#   tp:      TP=N gpt-neo shards: independent vs replicated tensors collective (forced, and auto).
# Each configuration runs REPS times (default 2) in alternation, in the same run, for each
# number of copy streams per rank in STREAMS (default "8"). Prints the
# slowest rank per run and a summary; JSON lines go to OUT_DIR/collective.jsonl.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bench-out}
reps=${2:-2}
mkdir -p "$out"
build=${BUILD_DIR:-$root/build-gpu}
data=${DATA:-/tmp/ckpt-bench}
py=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
ngpu=$(nvidia-smi -L | wc -l)
res=$out/collective.jsonl
: > "$res"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ckpt-bench-gpu
fi
bench=$build/bin/ckpt-bench-gpu
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m; echo "cpus: $(nproc)"; } \
  | tee "$out/collective_machine.txt"
mkdir -p "$data"
[ -f "$data/model.safetensors" ] || "$py" "$root/tools/bench_baselines.py" gen "$data" >/dev/null
shm=ckpt-bench-coll-$$
trap '"$bench" unlink $shm || true; rm -f "$out"/crun.* "$out"/ncclid.*' EXIT
"$bench" segment "$data/model.safetensors" $shm | tee -a "$res"
start_at() { "$py" -c 'import time; print(f"{time.time() + '"$1"':.3f}")'; }
t=$(start_at 4)
for g in $(seq 0 $((ngpu - 1))); do "$bench" limit $g 2 $t > "$out/crun.$g" & done; wait
cat "$out"/crun.* | sed 's/"what":"limit"/"what":"limit_all"/' | tee -a "$res"
for rep in $(seq "$reps"); do
  for st in ${STREAMS:-8}; do
  for cfg in replica:independent replica:collective tp:independent tp:collective tp:auto; do
    IFS=: read kind mode <<< "$cfg"
    rm -f "$out"/crun.* "$out"/ncclid.*; t=$(start_at ${LEAD_S:-6})
    pids=(); for r in $(seq 0 $((ngpu - 1))); do
      "$bench" collective $shm $r $ngpu $r $kind $mode "$out/ncclid.$rep" $t $st > "$out/crun.$r" 2> "$out/crun.$r.err" & pids+=($!)
    done
    wait "${pids[@]}" || { echo "run $cfg failed:"; cat "$out"/crun.*.err; }
    cat "$out"/crun.? | sed "s/^{/{\"rep\":$rep,/" | tee -a "$res"
  done
  done
done
"$py" - "$res" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
limit = [r["pinned_GiBps"] for r in rows if r["what"] == "limit_all"]
print(f"\npinned H2D limit, all GPUs at once: {min(limit):.1f}-{max(limit):.1f} GiB/s per GPU")
runs = collections.defaultdict(list)
for r in rows:
    if r["what"] == "collective":
        runs[(r["kind"], r["streams"], r["mode"], r["rep"])].append(r)
best = {}
print("| load | streams | mode | rep | slowest rank s | host GiB/rank (max) | received GiB/rank (max) | exchange s | shared |")
print("|---|---|---|---|---|---|---|---|---|")
for (kind, st, mode, rep), rs in sorted(runs.items()):
    s = max(r["seconds"] for r in rs)
    best[(kind, st, mode)] = min(best.get((kind, st, mode), 1e9), s)
    print(f"| {kind} x{len(rs)} | {st} | {mode} | {rep} | {s:.3f} | {max(r['host_GiB'] for r in rs):.2f} | "
          f"{max(r['received_GiB'] for r in rs):.2f} | {max(r['exchange_s'] for r in rs):.3f} | {rs[0]['shared']} |")
for (kind, st, mode), b in sorted(best.items()):
    ind = best.get((kind, st, "independent"))
    if mode != "independent" and ind:
        print(f"{kind}, {st} streams: independent {ind:.3f} s / {mode} {b:.3f} s = {ind / b:.2f}x (best of reps)")
PY
