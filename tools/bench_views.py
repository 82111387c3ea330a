#!/usr/bin/python3
"""What copy-on-write views cost (issue 13): a private mapping's first read, reads after
that, and writes (one page copied per page first written), against clone() (a private
copy of the whole tensor up front). Starts a private ckptd, loads one fp32 tensor of --mib MiB, then in fresh
attachments:

    PYTHONPATH=build/python /usr/bin/python3 tools/bench_views.py --ckptd build/bin/ckptd --mib 256

Prints one line per measurement (seconds, GiB/s, anonymous memory of the writer)."""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint  # noqa: E402


def anonymous_bytes_of(address: int) -> int:
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return -1


def timed(what, nbytes, fn):
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"{what:58s} {dt:8.4f} s  {nbytes / dt / 2**30:6.2f} GiB/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", default="build/bin/ckptd")
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    prefix = f"benchviews{os.getpid()}"
    sock = os.path.join(tmp, "ckptd.sock")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix, "--state-dir",
                               os.path.join(tmp, "state"), "--cleanup-on-exit"], stderr=subprocess.DEVNULL)
    try:
        client = ckpt.connect(sock, wait=10)
        n = args.mib * 2**20 // 4
        path = os.path.join(tmp, "big.safetensors")
        make_checkpoint.write_safetensors(path, {"w": torch.arange(n, dtype=torch.float32)})
        os.sync()
        client.load(path, "big")
        nbytes = n * 4
        page = os.sysconf("SC_PAGE_SIZE")

        c = client.attach("big")
        t = c.tensor("w")
        timed("view (private mapping): first read, sum()", nbytes, lambda: t.sum())
        timed("view (private mapping): read again, sum()", nbytes, lambda: t.sum())
        timed("clone() of the view (new memory, for comparison)", nbytes, lambda: t.clone())
        b = t.view(torch.uint8)
        before = anonymous_bytes_of(b.data_ptr())
        idx = torch.arange(0, nbytes, page)
        timed("view: write 1 byte in every page (copy-on-write)", nbytes, lambda: b.index_fill_(0, idx, 1))
        after = anonymous_bytes_of(b.data_ptr())
        print(f"{'writer anonymous memory in its view: before / after':58s} {before / 2**20:8.1f} MiB -> "
              f"{after / 2**20:.1f} MiB (checkpoint {nbytes / 2**20:.0f} MiB)", flush=True)
        timed("view: write every byte again (pages already private)", nbytes, lambda: t.add_(1))
        c.verify()
        print("checkpoint verify after the writes: passed", flush=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join("/dev/shm", prefix), ignore_errors=True)


if __name__ == "__main__":
    main()
