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
import sys
import threading
import time

import torch


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_checkpoint import NEO_SMALL, gpt_neo_state_dict  # noqa: E402  (the one GPT-Neo-2.7B builder)


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


PUBLISH_SECONDS = {}  # pages -> the first publish's seconds


def bench_ckptd(args, sd, pages, emit, sync, dev, gib, nbytes):
    """One daemon with its segments on `pages` (4k: /dev/shm; huge: a huge=within_size
    tmpfs mounted on its segment directory): publish (declare and commit timed apart), a
    second generation, then a fresh attach + state_dict to the GPU, split into phases."""
    import ckpt
    from ckpt.writer import Writer

    marks = {}

    class TimedWriter(Writer):
        """Writer with the client's phases clocked (the ring's mapping and registration,
        the first and last staged byte, the unregistration)."""

        def _on_ring(self, address, nbytes):
            marks["ring_mapped"] = time.perf_counter()
            super()._on_ring(address, nbytes)
            marks["registered"] = time.perf_counter()

        def _off_ring(self, address, nbytes):
            marks["off_start"] = time.perf_counter()
            super()._off_ring(address, nbytes)
            marks["off_end"] = time.perf_counter()

        def _filler(self, t):
            fill = super()._filler(t)

            def timed(offset, ring_offset, size):
                marks.setdefault("first_fill", time.perf_counter())
                fill(offset, ring_offset, size)
                marks["last_fill"] = time.perf_counter()
            return timed
    sock = os.path.join(args.workdir, f"ckptd-{pages}.sock")
    prefix = f"save{os.getpid()}{pages}"
    seg_dir = os.path.join("/dev/shm", prefix)
    mounted = False
    if pages == "huge":
        os.makedirs(seg_dir, mode=0o750, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.huge_size},huge=within_size,mode=0750",
                            "tmpfs", seg_dir], capture_output=True, text=True)
        if r.returncode != 0:
            emit(what="skip", pages=pages, why="cannot mount a huge tmpfs: " + r.stderr.strip())
            return
        mounted = True
    log_path = os.path.join(args.workdir, f"ckptd-{pages}.log")
    log = open(log_path, "wb")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix, "--cleanup-on-exit",
                               "--state-dir", os.path.join(args.workdir, f"state-{pages}"),
                               "--load-threads", str(min(16, os.cpu_count() or 8))], stdout=log, stderr=log)
    try:
        client = ckpt.connect(sock, wait=10)
        sync()
        with Sampler() as m:
            t0 = time.perf_counter()
            w = TimedWriter(client._c.socket_path, "neo", part=0, parts=1)
            for key, tensor in sd.items():
                w.add(key, tensor)
            t_decl = time.perf_counter() - t0
            marks["commit"] = time.perf_counter()
            summary = w.commit()
            t_pub = time.perf_counter() - t0
            marks["returned"] = time.perf_counter()
        order = ["commit", "ring_mapped", "registered", "first_fill", "last_fill", "off_start", "off_end", "returned"]
        phases = {f"{a}->{b}": round(marks[b] - marks[a], 4) for a, b in zip(order, order[1:]) if a in marks and b in marks}
        PUBLISH_SECONDS[pages] = t_pub
        emit(what="save", pages=pages, how="ckptd publish (GPU -> ring -> segment, checksums, published)",
             seconds=round(t_pub, 3), declare_seconds=round(t_decl, 3), GiB_per_s=round(gib / t_pub, 2),
             host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3), host_ratio=round((m.peak - m.base) / nbytes, 4),
             daemon_load_seconds=summary["load_seconds"], page_bytes=summary.get("page_bytes"),
             huge_bytes=summary.get("huge_bytes"), client_phases_s=phases)
        with Sampler() as m:
            t0 = time.perf_counter()
            client.publish("neo", sd, replace=True)
            t_pub2 = time.perf_counter() - t0
        emit(what="save", pages=pages, how="ckptd publish, replace (second generation)", seconds=round(t_pub2, 3),
             GiB_per_s=round(gib / t_pub2, 2), host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
             host_ratio=round((m.peak - m.base) / nbytes, 4))
        # Restore: a fresh attach, the whole state dict to the GPU, split into phases.
        sync()
        t0 = time.perf_counter()
        c = client.attach("neo")
        t_att = time.perf_counter() - t0
        got = c.state_dict(device=dev)
        sync()
        t_res = time.perf_counter() - t0
        same = all(torch.equal(got[k], v) for k, v in sd.items())
        del got
        sync()
        t1 = time.perf_counter()
        again = c.state_dict(device=dev)  # the same attach again: pages mapped, registration warm
        sync()
        t_again = time.perf_counter() - t1
        del again
        t2 = time.perf_counter()
        del c
        import gc
        gc.collect()
        t_detach = time.perf_counter() - t2
        emit(what="restore", pages=pages, how="ckptd attach + state_dict(device=cuda) (copy engine)",
             seconds=round(t_res, 3), attach_seconds=round(t_att, 3), state_dict_seconds=round(t_res - t_att, 3),
             second_state_dict_same_attach_seconds=round(t_again, 3), detach_seconds=round(t_detach, 3),
             GiB_per_s=round(gib / t_res, 2), equal=same)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        log.close()
        with open(log_path, "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                if any(k in line for k in ("writing 'neo'", "checksums of", "published 'neo'", "segment directory")):
                    emit(what="daemon_log", pages=pages, line=line[:400])
        if mounted:
            subprocess.run(["umount", "-l", seg_dir])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--skip", default="", help="comma list of: torchsave,dcp")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--small", action="store_true", help="a small state dict (a dry run)")
    ap.add_argument("--pages", default="4k,huge",
                    help="the daemon's segment directory: 4k (/dev/shm) and/or huge (a huge=within_size tmpfs mounted "
                         "there; needs root), comma list, each with its own daemon")
    ap.add_argument("--huge-size", default="24g", help="size= of the huge-page tmpfs")
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

    sd = gpt_neo_state_dict(dev, shape=NEO_SMALL if args.small else None)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    gib = nbytes / 2**30
    emit(what="state_dict", tensors=len(sd), GiB=round(gib, 3), device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
         torch=torch.__version__, cpus=os.cpu_count())

    pages_list = [p for p in args.pages.split(",") if p]
    for pages in pages_list:
        bench_ckptd(args, sd, pages, emit, sync, dev, gib, nbytes)
    def timed_save(how, save, path):
        """Runs save(), then fsyncs `path`; emits both times, the host peak and ckptd's speedup."""
        with Sampler() as m:
            t0 = time.perf_counter()
            save()
            t_save = time.perf_counter() - t0
            fsync_tree(path)
            t_sync = time.perf_counter() - t0
        emit(what="save", how=how, seconds=round(t_save, 3),
             seconds_with_fsync=round(t_sync, 3), GiB_per_s=round(gib / t_save, 2),
             host_peak_over_base_GiB=round((m.peak - m.base) / 2**30, 3),
             speedup_of_ckptd={k: round(t_save / v, 2) for k, v in PUBLISH_SECONDS.items()})

    pt = os.path.join(args.workdir, "model.pt")
    if "torchsave" not in skip:
        timed_save("torch.save to local disk", lambda: torch.save(sd, pt), pt)
    dcp_dir = os.path.join(args.workdir, "dcp")
    if "dcp" not in skip:
        import torch.distributed.checkpoint as dcp
        shutil.rmtree(dcp_dir, ignore_errors=True)
        timed_save("DCP FileSystemWriter to local disk",
                   lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(dcp_dir)), dcp_dir)

    # ---- restores to the GPU from the files ----
    dropped = True
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
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| what | pages | how | seconds | GiB/s | host memory peak over base |\n|---|---|---|---|---|---|\n")
            for r in rows:
                if r["what"] in ("save", "restore"):
                    f.write(f"| {r['what']} | {r.get('pages', '')} | {r['how']} | {r['seconds']} | {r['GiB_per_s']} | "
                            f"{r.get('host_peak_over_base_GiB', '')} |\n")


if __name__ == "__main__":
    main()
