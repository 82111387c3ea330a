#!/usr/bin/env python3
"""torch.distributed.checkpoint (torch 2.x) to and from ckptd on the GPU machine (issue 15).

  check_dcp.py --ckptd build-gpu/bin/ckptd [--workdir /tmp/dcp] [--mib 1024] [--markdown OUT.md]

1. Round trips on CUDA tensors, one process (no process group): dcp.save -> dcp.load,
   dcp.async_save -> dcp.load, each into zeroed CUDA tensors, compared bit for bit; a
   non-tensor value and a nested dict too.
2. Timing, same state dict (GPT-shaped, --mib MiB of fp32 on the GPU): dcp.save to ckptd
   vs DCP's FileSystemWriter to --workdir, torch.save to --workdir; dcp.load from each
   (after dropping the page cache where the host allows it: echo 1 > drop_caches).
3. The CI tests under this torch: tests/python/test_dcp.py (gloo ranks under torchrun:
   ShardedTensor save, read back by 2, 3 and 1 processes; a failing rank).
Prints a line per check and exits non-zero if any failed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed.checkpoint as dcp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import ckpt  # noqa: E402
import ckpt.dcp  # noqa: E402


def gpt_state_dict(mib, device):
    hidden = 2560
    per_layer = 12 * hidden * hidden * 4
    layers = max(1, int(mib * 2**20 // per_layer))
    g = torch.Generator(device="cpu").manual_seed(0)
    sd = {}
    for i in range(layers):
        sd[f"h.{i}.attn.qkv.weight"] = torch.randn(3 * hidden, hidden, generator=g)
        sd[f"h.{i}.attn.out.weight"] = torch.randn(hidden, hidden, generator=g)
        sd[f"h.{i}.mlp.fc.weight"] = torch.randn(4 * hidden, hidden, generator=g)
        sd[f"h.{i}.mlp.proj.weight"] = torch.randn(hidden, 4 * hidden, generator=g)
        sd[f"h.{i}.ln.weight"] = torch.randn(hidden, generator=g)
    return {k: v.to(device) for k, v in sd.items()}


def zeros_like(sd):
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in sd.items()}


def drop_caches():
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", default="/tmp/dcp")
    ap.add_argument("--mib", type=float, default=1024)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    args.ckptd = os.path.abspath(args.ckptd)  # the unit tests below run from tests/python
    os.makedirs(args.workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="dcpd", dir="/tmp")
    sock = os.path.join(tmp, "ckptd.sock")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"dcpcheck{os.getpid()}",
                               "--state-dir", os.path.join(tmp, "state"), "--cleanup-on-exit"],
                              stdout=open(os.path.join(tmp, "log"), "wb"), stderr=subprocess.STDOUT)
    failures = []

    def check(name, ok, detail=""):
        print(("OK   " if ok else "FAIL ") + name + (" " + detail if detail else ""), flush=True)
        if not ok:
            failures.append(name)

    try:
        client = ckpt.connect(sock, wait=10)
        print("torch", torch.__version__, "device", torch.cuda.get_device_name(0), flush=True)
        # 1. Round trips on CUDA.
        small = {"w": torch.randn(64, 32, device="cuda"), "b": torch.randn(32, device="cuda").bfloat16(),
                 "step": 7, "opt": {"lr": 0.5, "betas": (0.9, 0.99)}}
        dcp.save(small, storage_writer=ckpt.dcp.StorageWriter("dcp-small", client))
        back = {"w": torch.zeros(64, 32, device="cuda"), "b": torch.zeros(32, device="cuda", dtype=torch.bfloat16),
                "step": 0, "opt": {"lr": 0.0, "betas": None}}
        dcp.load(back, storage_reader=ckpt.dcp.StorageReader("dcp-small", client))
        check("dcp.save/load cuda", torch.equal(back["w"], small["w"]) and torch.equal(back["b"], small["b"])
              and back["step"] == 7 and back["opt"] == {"lr": 0.5, "betas": (0.9, 0.99)})
        fut = dcp.async_save(small, storage_writer=ckpt.dcp.StorageWriter("dcp-async", client))
        fut.result()
        back2 = {"w": torch.zeros(64, 32, device="cuda"), "b": torch.zeros(32, device="cuda", dtype=torch.bfloat16),
                 "step": 0, "opt": {"lr": 0.0, "betas": None}}
        dcp.load(back2, checkpoint_id="dcp-async", storage_reader=ckpt.dcp.StorageReader(client=client))
        check("dcp.async_save/load (checkpoint_id) cuda", torch.equal(back2["w"], small["w"]) and back2["step"] == 7)

        # 2. Timing.
        sd = gpt_state_dict(args.mib, "cuda")
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        rows = []
        t_ckpt, _ = timed(lambda: dcp.save(sd, storage_writer=ckpt.dcp.StorageWriter("dcp-big", client)))
        rows.append(("dcp.save -> ckptd", t_ckpt))
        fs = os.path.join(args.workdir, "fs")
        shutil.rmtree(fs, ignore_errors=True)
        t_fs, _ = timed(lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(fs)))
        rows.append(("dcp.save -> FileSystemWriter (fsync)", t_fs))
        pt = os.path.join(args.workdir, "sd.pt")

        def torch_save():
            torch.save(sd, pt)
            with open(pt, "rb") as f:
                os.fsync(f.fileno())
        t_pt, _ = timed(torch_save)
        rows.append(("torch.save to disk (+fsync)", t_pt))
        target = zeros_like(sd)
        t_l, _ = timed(lambda: dcp.load(target, storage_reader=ckpt.dcp.StorageReader("dcp-big", client)))
        check("dcp.load from ckptd equal", all(torch.equal(target[k], sd[k]) for k in sd))
        rows.append(("dcp.load <- ckptd", t_l))
        dropped = drop_caches()
        target = zeros_like(sd)
        t_lf, _ = timed(lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(fs)))
        rows.append(("dcp.load <- FileSystemReader" + (" (page cache dropped)" if dropped else " (page cache warm)"), t_lf))
        dropped = drop_caches()
        t_lp, _ = timed(lambda: {k: v.to("cuda") for k, v in torch.load(pt, map_location="cpu").items()})
        rows.append(("torch.load + .cuda()" + (" (page cache dropped)" if dropped else " (page cache warm)"), t_lp))
        lines = ["| %.2f GiB fp32 state dict on the GPU | seconds | GiB/s |" % (nbytes / 2**30), "|---|---|---|"]
        lines += ["| %s | %.3f | %.2f |" % (n, t, nbytes / 2**30 / t) for n, t in rows]
        print("\n".join(lines), flush=True)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write("\n".join(lines) + "\n")
        sd = target = None  # free the GPU memory before the CI tests
        client = None

        # 3. The CI tests under this torch.
        env = dict(os.environ, CKPTD_BIN=args.ckptd, CKPT_TOOLS_DIR=os.path.join(ROOT, "tools"))
        r = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_dcp", "test_serving_cache", "test_persist"],
                           cwd=os.path.join(ROOT, "tests", "python"), env=env, capture_output=True, text=True,
                           timeout=900)
        print(r.stderr[-6000:], flush=True)
        check("tests/python test_dcp test_serving_cache test_persist", r.returncode == 0)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
