#!/usr/bin/env python3
"""Save benchmark (issue 15): the 9.88 GiB GPT-Neo-2.7B-shaped fp32 state dict (420
tensors) from GPU memory into ckptd (Client.publish), against torch.save to local disk and
torch.distributed.checkpoint's FileSystemWriter; then restoring it to the GPU from ckptd
(the copy engine's state_dict) against from those files with the page cache dropped.
Samples node host memory (Shmem + AnonPages, /proc/meminfo) during each save.

  tools/gpu/bench_save.py --ckptd build-gpu/bin/ckptd --workdir /tmp/save [--json OUT.jsonl] [--markdown OUT.md]

Each figure is printed as one JSON line as soon as it is measured (and appended to --json).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import torch

import ckpt

HIDDEN, LAYERS, VOCAB, POS = 2560, 32, 50257, 2048


def state_dict_on_gpu(dev, small=False):
    global HIDDEN, LAYERS, VOCAB, POS
    if small:  # a dry run of the script itself
        HIDDEN, LAYERS, VOCAB, POS = 256, 2, 1000, 128
    g = torch.Generator(device=dev).manual_seed(0)
    sd = {}

    def add(name, *shape):
        sd[name] = torch.randn(*shape, generator=g, device=dev) * 0.02
    add("transformer.wte.weight", VOCAB, HIDDEN)
    add("transformer.wpe.weight", POS, HIDDEN)
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        add(p + "ln_1.weight", HIDDEN); add(p + "ln_1.bias", HIDDEN)
        for k in "kvq":
            add(p + f"attn.attention.{k}_proj.weight", HIDDEN, HIDDEN)
        add(p + "attn.attention.out_proj.weight", HIDDEN, HIDDEN); add(p + "attn.attention.out_proj.bias", HIDDEN)
        add(p + "ln_2.weight", HIDDEN); add(p + "ln_2.bias", HIDDEN)
        add(p + "mlp.c_fc.weight", 4 * HIDDEN, HIDDEN); add(p + "mlp.c_fc.bias", 4 * HIDDEN)
        add(p + "mlp.c_proj.weight", HIDDEN, 4 * HIDDEN); add(p + "mlp.c_proj.bias", HIDDEN)
    add("transformer.ln_f.weight", HIDDEN); add("transformer.ln_f.bias", HIDDEN)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return sd


def meminfo_bytes():
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            fields[k] = int(v.split()[0]) * 1024
    return fields["Shmem"] + fields["AnonPages"]


class Sampler:
    """Peak of Shmem + AnonPages while running, every 5 ms."""

    def __init__(self):
        self.base = meminfo_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, meminfo_bytes())
            time.sleep(0.005)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, meminfo_bytes())


NO_DROP = False


def drop_caches():
    os.sync()
    if NO_DROP:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fsync_tree(path):
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--skip", default="", help="comma list of: torchsave,dcp")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--small", action="store_true", help="a small state dict (a dry run)")
    ap.add_argument("--no-drop", action="store_true", help="do not drop the page cache (a dry run)")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    global NO_DROP
    NO_DROP = args.no_drop
    os.makedirs(args.workdir, exist_ok=True)
    dev = torch.device(args.device)
    rows = []
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def emit(**row):
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")

    sd = state_dict_on_gpu(dev, args.small)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    gib = nbytes / 2**30
    emit(what="state_dict", tensors=len(sd), GiB=round(gib, 3), device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
         torch=torch.__version__, cpus=os.cpu_count())

    sock = os.path.join(args.workdir, "ckptd.sock")
    prefix = f"save{os.getpid()}"
    log = open(os.path.join(args.workdir, "ckptd.log"), "wb")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix, "--cleanup-on-exit",
                               "--state-dir", os.path.join(args.workdir, "state"),
                               "--load-threads", str(min(16, os.cpu_count() or 8))], stdout=log, stderr=log)
    try:
        client = ckpt.connect(sock, wait=10)
        # ---- saves ----
        sync()
        with Sampler() as m:
            t0 = time.perf_counter()
            summary = client.publish("neo", sd)
            t_pub = time.perf_counter() - t0
        emit(what="save", how="ckptd publish (GPU -> ring -> segment, checksums, published)", seconds=round(t_pub, 3),
             GiB_per_s=round(gib / t_pub, 2), host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
             host_ratio=round((m.peak - m.base) / nbytes, 4), daemon_load_seconds=summary["load_seconds"])
        # A second generation (replace): the daemon's pages are fresh again, as in training.
        with Sampler() as m:
            t0 = time.perf_counter()
            client.publish("neo", sd, replace=True)
            t_pub2 = time.perf_counter() - t0
        emit(what="save", how="ckptd publish, replace (second generation)", seconds=round(t_pub2, 3),
             GiB_per_s=round(gib / t_pub2, 2), host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
             host_ratio=round((m.peak - m.base) / nbytes, 4))
        pt = os.path.join(args.workdir, "model.pt")
        if "torchsave" not in skip:
            with Sampler() as m:
                t0 = time.perf_counter()
                torch.save(sd, pt)
                t_save = time.perf_counter() - t0
                fsync_tree(pt)
                t_sync = time.perf_counter() - t0
            emit(what="save", how="torch.save to local disk", seconds=round(t_save, 3),
                 seconds_with_fsync=round(t_sync, 3), GiB_per_s=round(gib / t_save, 2),
                 host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
                 speedup_of_ckptd=round(t_save / t_pub, 2))
        dcp_dir = os.path.join(args.workdir, "dcp")
        if "dcp" not in skip:
            import torch.distributed.checkpoint as dcp
            shutil.rmtree(dcp_dir, ignore_errors=True)
            with Sampler() as m:
                t0 = time.perf_counter()
                dcp.save(sd, storage_writer=dcp.FileSystemWriter(dcp_dir))
                t_dcp = time.perf_counter() - t0
                fsync_tree(dcp_dir)
                t_dsync = time.perf_counter() - t0
            emit(what="save", how="DCP FileSystemWriter to local disk", seconds=round(t_dcp, 3),
                 seconds_with_fsync=round(t_dsync, 3), GiB_per_s=round(gib / t_dcp, 2),
                 host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
                 speedup_of_ckptd=round(t_dcp / t_pub, 2))

        # ---- restores to the GPU ----
        dropped = drop_caches()
        sync()
        t0 = time.perf_counter()
        c = client.attach("neo")
        got = c.state_dict(device=dev)
        sync()
        t_res = time.perf_counter() - t0
        same = all(torch.equal(got[k], v) for k, v in sd.items())
        emit(what="restore", how="ckptd attach + state_dict(device=cuda) (copy engine)", seconds=round(t_res, 3),
             GiB_per_s=round(gib / t_res, 2), equal=same)
        del got, c
        if "torchsave" not in skip:
            dropped = drop_caches() and dropped
            t0 = time.perf_counter()
            got = torch.load(pt, map_location=dev, weights_only=True)
            sync()
            t_tl = time.perf_counter() - t0
            emit(what="restore", how="torch.load(map_location=cuda), page cache dropped", seconds=round(t_tl, 3),
                 GiB_per_s=round(gib / t_tl, 2), caches_dropped=dropped, equal=all(torch.equal(got[k], v) for k, v in sd.items()))
            del got
        if "dcp" not in skip:
            import torch.distributed.checkpoint as dcp
            dropped = drop_caches() and dropped
            target = {k: torch.empty_like(v) for k, v in sd.items()}
            sync()
            t0 = time.perf_counter()
            dcp.load(target, storage_reader=dcp.FileSystemReader(dcp_dir))
            sync()
            t_dl = time.perf_counter() - t0
            emit(what="restore", how="DCP FileSystemReader into GPU tensors, page cache dropped", seconds=round(t_dl, 3),
                 GiB_per_s=round(gib / t_dl, 2), caches_dropped=dropped,
                 equal=all(torch.equal(target[k], v) for k, v in sd.items()))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        log.close()
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"| what | how | seconds | GiB/s | host memory peak over base |\n|---|---|---|---|---|\n")
            for r in rows:
                if r["what"] in ("save", "restore"):
                    f.write(f"| {r['what']} | {r['how']} | {r['seconds']} | {r['GiB_per_s']} | "
                            f"{r.get('host_peak_over_base_GiB', '')} |\n")


if __name__ == "__main__":
    main()
