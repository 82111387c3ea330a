#!/usr/bin/python3
"""Measures `ensure` against a private ckptd: the first ensure (a load), an ensure that finds
the checkpoint current, and N processes calling ensure at once (one load, the others wait).

  /usr/bin/python3 tools/bench_ensure.py BUILD_DIR [--mib 256] [--ranks 8] [--calls 200]

Writes a sparse safetensors file (one F32 tensor whose data is a hole) in a scratch
directory; prints one line per figure."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from make_checkpoint import safetensors_header  # tools/: the one Python writer

RANK = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
import ckpt
c = ckpt.connect(sys.argv[1])
while not os.path.exists(sys.argv[3]):
    time.sleep(0.0005)
t = time.perf_counter()
r = c.ensure(sys.argv[2], "m")
print(r["action"], time.perf_counter() - t, flush=True)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    pydir = os.path.join(os.path.abspath(a.build), "python")
    sys.path.insert(0, pydir)
    import ckpt
    tmp = tempfile.mkdtemp()
    prefix = f"ckbenchensure{os.getpid()}"
    daemon = None
    try:
        path = os.path.join(tmp, "m.safetensors")
        n = a.mib << 20
        header = safetensors_header([("big", "F32", [n // 4], n)])
        with open(path, "wb") as f:
            f.write(header)
            f.truncate(len(header) + n)
        sock = os.path.join(tmp, "s.sock")
        daemon = subprocess.Popen([os.path.join(a.build, "bin", "ckptd"), "--socket", sock, "--shm-prefix", prefix,
                                   "--state-dir", os.path.join(tmp, "state"), "--cleanup-on-exit"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = ckpt.connect(sock, wait=10)
        t = time.perf_counter()
        r = c.ensure(path, "m")
        print(f"first ensure ({a.mib} MiB): {r['action']} in {time.perf_counter() - t:.3f} s")
        t = time.perf_counter()
        for _ in range(a.calls):
            assert c.ensure(path, "m")["action"] == "current"
        print(f"ensure when current: {(time.perf_counter() - t) / a.calls * 1e3:.2f} ms per call ({a.calls} calls)")
        c.evict("m")
        go = os.path.join(tmp, "go")
        procs = [subprocess.Popen([sys.executable, "-c", RANK, sock, path, go, pydir], stdout=subprocess.PIPE,
                                  text=True) for _ in range(a.ranks)]
        time.sleep(3)  # every interpreter is up and polls for the go file
        open(go, "w").close()
        outs = [p.communicate()[0].split() for p in procs]
        actions = sorted(o[0] for o in outs)
        loads = [l for l in c.metrics().splitlines() if l.startswith("ckptd_loads_total ")]
        print(f"{a.ranks} ranks at once: {actions.count('loaded')} loaded, {actions.count('joined')} joined, "
              f"{actions.count('current')} current; slowest rank {max(float(o[1]) for o in outs):.3f} s; "
              f"daemon loads in all (incl. the first): {loads[0].split()[1]}")
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join("/dev/shm", prefix), ignore_errors=True)


if __name__ == "__main__":
    main()
