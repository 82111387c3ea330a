#!/usr/bin/env python3
"""Reproduces the reported host-memory blow-up and measures ckptd against it.

For each rank count N, N processes each load a tensor-parallel shard (TP = N) of a
GPT-Neo-2.7B-shaped checkpoint, the way people do today and through ckptd, while the
parent samples the node's Shmem + AnonPages (/proc/meminfo) for the peak, less what the
same N processes cost when they load nothing (Python, torch, CUDA contexts):

  today   each rank torch.load()s the whole pytorch_model.bin, slices its shard and moves
          it to its GPU (cuda:rank % GPUs), keeping the state dict until all ranks are
          done - as a per-rank from_pretrained + init_inference does;
  ckptd   the daemon loads model.safetensors once; each rank attaches and takes its shard
          with ckpt.state_dict(plan="gpt-neo") to its GPU (CPU: zero-copy views).

  tools/repro_host_memory.py --workdir DIR [--ranks 1,2,4,8,10] [--scale 1.0]
        [--ckptd build/bin/ckptd] [--host-path bounce|register] [--plot docs/img/host_memory.png] [--markdown OUT.md]

--scale shrinks the model (hidden and layers) for machines with less memory. Needs torch
and the ckpt module on PYTHONPATH (build/python).
"""
import torch_python  # noqa: F401  (first: re-runs this script under a Python with torch if need be)
import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import torch

import ckpt
import ckpt.plans  # noqa: F401

# The GPT-Neo layout the built-in "gpt-neo" plan (megatron) gives, written out as the check's
# own reference: {regex: split dim}; unmatched tensors whole.
GPT_NEO_SPLITS = {r"attn\.attention\.[qkv]_proj\.weight$": 0, r"attn\.attention\.out_proj\.weight$": -1,
                  r"mlp\.c_fc\.(weight|bias)$": 0, r"mlp\.c_proj\.weight$": -1, r"(^|\.)wte\.weight$": 0,
                  r"^lm_head\.weight$": 0}


def node_bytes():
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("Shmem", "AnonPages"):
                total += int(value.split()[0]) * 1024
    return total


def gpt_neo_state_dict(scale):
    """The tensors of GPTNeoForCausalLM (2.7B: hidden 2560, 32 layers, vocab 50257, 420 tensors)."""
    hidden = max(64, int(2560 * scale) // 64 * 64)
    layers = max(1, int(round(32 * scale)))
    vocab, positions = 50257, 2048
    gen = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    sd = {"transformer.wte.weight": w(vocab, hidden), "transformer.wpe.weight": w(positions, hidden)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = torch.ones(hidden), torch.zeros(hidden)
        for proj in ("k_proj", "v_proj", "q_proj"):
            sd[p + f"attn.attention.{proj}.weight"] = w(hidden, hidden)
        sd[p + "attn.attention.out_proj.weight"], sd[p + "attn.attention.out_proj.bias"] = w(hidden, hidden), w(hidden)
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = torch.ones(hidden), torch.zeros(hidden)
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = w(4 * hidden, hidden), w(4 * hidden)
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = w(hidden, 4 * hidden), w(hidden)
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = torch.ones(hidden), torch.zeros(hidden)
    return sd


def rank_device(rank):
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def shard_today(sd, name, rank, world):
    """Slices a full state dict the way the plan does (reference path)."""
    t = sd[name]
    for pattern, dim in GPT_NEO_SPLITS.items():
        import re
        if re.search(pattern, name):
            return torch.tensor_split(t, world, dim)[rank]
    return t


def rank_today(rank, world, path, ready, release, results):
    start = time.perf_counter()
    device = rank_device(rank)
    sd = torch.load(path, map_location="cpu")
    shards = {n: shard_today(sd, n, rank, world).to(device) for n in sd}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    results.put((rank, time.perf_counter() - start))
    ready.wait()
    release.wait()
    del sd, shards


def rank_ckptd(rank, world, arg, ready, release, results):
    socket, host_path = arg
    start = time.perf_counter()
    device = rank_device(rank)
    client = ckpt.connect(socket)
    kwargs = {"host_path": host_path} if device.type == "cuda" else {}
    shards = client.state_dict("gpt-neo", rank, world, "gpt-neo", device=device, **kwargs)
    results.put((rank, time.perf_counter() - start))
    ready.wait()
    release.wait()
    del shards


def rank_idle(rank, world, _, ready, release, results):
    """The per-process cost alone (Python, torch, CUDA context): subtracted from both modes."""
    device = rank_device(rank)
    if device.type == "cuda":
        torch.zeros(1, device=device)
    results.put((rank, 0.0))
    ready.wait()
    release.wait()


def run_ranks(target, n, arg):
    ctx = mp.get_context("spawn")
    ready, release, results = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Queue()
    base = node_bytes()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], node_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    procs = [ctx.Process(target=target, args=(r, n, arg, ready, release, results)) for r in range(n)]
    for p in procs:
        p.start()

    def watch():
        # A rank that dies (a crash, OOM) would leave the others waiting at the barriers.
        while not stop.is_set():
            if any(p.exitcode not in (None, 0) for p in procs):
                ready.abort()
                release.abort()
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ready.wait()  # every rank holds what it loaded
        peak[0] = max(peak[0], node_bytes())
        times = sorted(results.get()[1] for _ in range(n))
        release.wait()
        for p in procs:
            p.join()
    except threading.BrokenBarrierError:
        for p in procs:
            p.terminate()
            p.join()
        raise RuntimeError(f"{target.__name__}: a rank failed, exit codes {[p.exitcode for p in procs]}") from None
    finally:
        stop.set()
        sampler.join()
        watcher.join()
    return peak[0] - base, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ranks", default="1,2,4,8,10")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--ckptd", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "ckptd"))
    ap.add_argument("--modes", default="today,ckptd")
    ap.add_argument("--host-path", default="bounce", choices=["bounce", "register", "pageable"],
                    help="the CUDA engine's host path for the ckptd ranks (register: no pinned staging buffers)")
    ap.add_argument("--plot")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_checkpoint

    os.makedirs(args.workdir, exist_ok=True)
    bin_path = os.path.join(args.workdir, "pytorch_model.bin")
    st_path = os.path.join(args.workdir, "model.safetensors")
    if not (os.path.exists(bin_path) and os.path.exists(st_path)):
        sd = gpt_neo_state_dict(args.scale)
        torch.save(sd, bin_path)
        make_checkpoint.write_safetensors(st_path, sd)
        del sd
    size = os.path.getsize(st_path)
    ranks = [int(r) for r in args.ranks.split(",")]
    modes = args.modes.split(",")
    print(f"checkpoint {size / 2**30:.2f} GiB; GPUs: {torch.cuda.device_count()}; CPUs: {os.cpu_count()}", flush=True)

    rows = []
    idle = {}
    for n in ranks:
        idle[n] = run_ranks(rank_idle, n, None)[0]
        print(f"idle   N={n:2d}: {idle[n] / 2**30:.2f} GiB for the processes themselves (subtracted below)", flush=True)
    if "today" in modes:
        for n in ranks:
            mem, times = run_ranks(rank_today, n, bin_path)
            mem -= idle[n]
            rows.append(("today (torch.load per rank)", n, mem, times))
            print(f"today  N={n:2d}: node memory +{mem / 2**30:6.2f} GiB = {mem / size:5.2f} x checkpoint; "
                  f"per-rank load {times[0]:.2f}-{times[-1]:.2f} s", flush=True)
    if "ckptd" in modes:
        sock = os.path.join(args.workdir, "ckptd.sock")
        prefix = f"ckptrepro{os.getpid()}"
        daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix, "--cleanup-on-exit",
                                   "--state-dir", os.path.join(args.workdir, "ckptd-state"), "--load-threads", str(min(16, os.cpu_count() or 2))])
        try:
            client = ckpt.connect(sock, wait=10)
            base = node_bytes()
            t0 = time.perf_counter()
            client.load(st_path, "gpt-neo")
            load_s = time.perf_counter() - t0
            shm = node_bytes() - base
            print(f"ckptd load: {load_s:.2f} s, +{shm / 2**30:.2f} GiB shared memory", flush=True)
            for n in ranks:
                mem, times = run_ranks(rank_ckptd, n, (sock, args.host_path))
                mem -= idle[n]
                rows.append((f"ckptd (one shared copy, {args.host_path})", n, mem + shm, times))
                print(f"ckptd  N={n:2d}: node memory +{(mem + shm) / 2**30:6.2f} GiB = {(mem + shm) / size:5.2f} x "
                      f"checkpoint; per-rank attach+shard {times[0]:.2f}-{times[-1]:.2f} s", flush=True)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()

    table = ["| loading | ranks | node memory (Shmem+AnonPages, peak) | x checkpoint | per-rank time |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for mode, n, mem, times in rows:
        table.append(f"| {mode} | {n} | {mem / 2**30:.2f} GiB | {mem / size:.2f} | {times[0]:.2f} - {times[-1]:.2f} s |")
    print("\n".join(table))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"checkpoint {size / 2**30:.2f} GiB, GPUs {torch.cuda.device_count()}, CPUs {os.cpu_count()}\n\n")
            f.write("\n".join(table) + "\n")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in dict.fromkeys(r[0] for r in rows):
            pts = [(n, mem / 2**30) for m, n, mem, _ in rows if m == mode]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.axhline(size / 2**30, color="gray", linestyle="--", label="checkpoint size")
        ax.set_xlabel("ranks (TP degree)")
        ax.set_ylabel("node host memory, GiB")
        ax.set_title("GPT-Neo-2.7B-shaped checkpoint: host memory by rank count")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
