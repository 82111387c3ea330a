#!/usr/bin/env python3
"""Issue 13 on the GPU machine: the GPU plugin (static CUDA runtime, NCCL opened at run
time) next to PyTorch's own CUDA runtime and NCCL in one process.

  check_layout.py --ckptd build-gpu/bin/ckptd [--workdir /tmp/layout]

For each import order (ckpt's plugin first, then torch.cuda; torch.cuda first), in a fresh
process: a GPU load through the plugin equals the CPU state dict, torch uses the tensors,
NcclGroup.unique_id() works, and only one libnccl is mapped. Prints the time of the first
GPU call (opening the plugin and the driver). Exit status 0 when every check passed."""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_checkpoint  # noqa: E402

CHILD = r"""
import os, sys, time
order = sys.argv[2]
if order == "torch-first":
    import torch
    torch.zeros(1, device="cuda")
import ckpt
t0 = time.perf_counter()
avail = ckpt._ckpt.gpu_available()
first_call = time.perf_counter() - t0
import torch
c = ckpt.connect(sys.argv[1]).attach("gpt")
gpu = c.state_dict(0, 2, {r"c_fc\.weight$": ckpt.column()}, device="cuda:0", engine="gpu")
cpu = c.state_dict(0, 2, {r"c_fc\.weight$": ckpt.column()})
bad = [n for n in cpu if not torch.equal(gpu[n].cpu(), cpu[n])]
s = sum(float(v.float().sum()) for v in gpu.values() if v.is_floating_point())
uid = ckpt._ckpt.NcclGroup.unique_id()
maps = open("/proc/self/maps").read().split("\n")
nccl = sorted({l.split()[-1] for l in maps if "libnccl" in l})
cudart = sorted({l.split()[-1] for l in maps if "libcudart" in l})
print(f"{order}: gpu_available={avail} first GPU call {first_call*1000:.1f} ms, {len(gpu)} tensors, "
      f"mismatches {bad[:3]}, uid {len(uid)} bytes, libnccl mapped {nccl}, libcudart mapped {cudart}")
sys.exit(0 if avail and not bad and len(nccl) <= 1 and len(uid) == 128 else 1)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", default="/tmp/layout")
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    path = os.path.join(a.workdir, "gpt.safetensors")
    make_checkpoint.write_safetensors(path, make_checkpoint.gpt_state_dict(mib=16, layers=2, seed=1))
    sock = os.path.join(a.workdir, "ckptd.sock")
    daemon = subprocess.Popen([a.ckptd, "--socket", sock, "--shm-prefix", f"ckptlayout{os.getpid()}",
                               "--state-dir", os.path.join(a.workdir, "state"), "--cleanup-on-exit"])
    try:
        import ckpt
        ckpt.connect(sock, wait=10).load(path, name="gpt")
        rc = 0
        for order in ("ckpt-first", "torch-first"):
            rc |= subprocess.call([sys.executable, "-c", CHILD, sock, order])
        print("layout checks:", "ok" if rc == 0 else "FAILED")
        return rc
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)


if __name__ == "__main__":
    sys.exit(main())
