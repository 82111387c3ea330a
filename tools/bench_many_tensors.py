#!/usr/bin/python3
"""Metadata cost per tensor (issue 23): load and publish of a checkpoint of many small
tensors, where every step that touches each tensor (header parse, load plan, segment
layout, catalog, index, attach, the Python state dict, ckptctl info) must be linear.
Starts a private ckptd, writes one safetensors file of --tensors tensors of 4 fp32 each,
then times, each in the same run:

    PYTHONPATH=build/python /usr/bin/python3 tools/bench_many_tensors.py --ckptd build/bin/ckptd \\
        --ckptctl build/bin/ckptctl --tensors 100000

  load (ckptd reads the file into a segment), attach + state_dict (every tensor as a torch
  view), ckptctl info --json, publish (the write path: Client.publish of the same tensors)
  and a second attach of the published generation. One line per step: seconds, and
  microseconds per tensor."""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import torch

from make_checkpoint import safetensors_header  # tools/: the one Python writer

import ckpt


def write_many(path: str, count: int) -> None:
    """A safetensors file of `count` tensors "t.<i>" of 4 fp32 each (by make_checkpoint's
    writer: safetensors' own is not needed and not always installed)."""
    with open(path, "wb") as f:
        f.write(safetensors_header([(f"t.{i}", "F32", [4], 16) for i in range(count)]))
        f.write(struct.pack("<%df" % (4 * count), *([1.0] * (4 * count))))


def timed(what: str, count: int, fn):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    print(f"{what:44s} {dt:8.3f} s  {dt / count * 1e6:7.2f} us/tensor", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", default="build/bin/ckptd")
    ap.add_argument("--ckptctl", default="build/bin/ckptctl")
    ap.add_argument("--tensors", type=int, default=100000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    prefix = f"benchmany{os.getpid()}"
    sock = os.path.join(tmp, "ckptd.sock")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix, "--state-dir",
                               os.path.join(tmp, "state"), "--cleanup-on-exit"], stderr=subprocess.DEVNULL)
    try:
        client = ckpt.connect(sock, wait=10)
        n = args.tensors
        path = os.path.join(tmp, "many.safetensors")
        timed(f"write the file ({n} tensors)", n, lambda: write_many(path, n))
        timed("load (ckptd: parse, plan, read, publish)", n, lambda: client.load(path, "many"))
        c = timed("attach", n, lambda: client.attach("many"))
        sd = timed("state_dict (every tensor a view)", n, lambda: c.state_dict())
        assert len(sd) == n, len(sd)
        info = timed("ckptctl info --json", n, lambda: subprocess.run(
            [args.ckptctl, "--socket", sock, "info", "many", "--json"], check=True, capture_output=True))
        assert len(info.stdout) > n
        tensors = {k: v.clone() for k, v in sd.items()}
        del sd, c
        timed("publish (the write path)", n, lambda: client.publish("many-pub", tensors))
        c = timed("attach the published generation", n, lambda: client.attach("many-pub"))
        assert len(c.keys()) == n
        print(f"tensors {n}, torch {torch.__version__}, cores {os.cpu_count()}")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join("/dev/shm", prefix), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
