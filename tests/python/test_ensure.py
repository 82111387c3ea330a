"""Client.ensure from Python against the real ckptd (issue 13): one load for many
processes at once, "current" when nothing changed, a new generation when the file did,
FailedPrecondition for a name loaded from another path; load reports what it evicted."""
import os
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import ckpt
from test_ckpt import Daemon, make_checkpoint

RANK = r"""
import os, sys, time, ckpt
socket, path, go = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.001)
r = ckpt.connect(socket).ensure(path, "m")
c = ckpt.connect(socket).attach("m")
print(r["action"], r["generation"], c.generation, flush=True)
"""


class EnsureTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.daemon.start()
        self.client = ckpt.connect(self.daemon.socket)

    def tearDown(self):
        self.client = None
        self.daemon.cleanup()
        self.tmp.cleanup()

    def write(self, name, seed, mib=2):
        path = os.path.join(self.tmp.name, name)
        make_checkpoint.write_safetensors(path, make_checkpoint.gpt_state_dict(mib=mib, layers=1, seed=seed))
        return path

    def test_many_processes_share_one_load(self):
        path = self.write("m.safetensors", 1, mib=64)
        go = os.path.join(self.tmp.name, "go")
        env = dict(os.environ)
        procs = [subprocess.Popen([sys.executable, "-c", RANK, self.daemon.socket, path, go],
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)]
        time.sleep(1.0)  # every interpreter started (and waits for the go file)
        open(go, "w").close()
        lines = [p.communicate(timeout=120)[0].split() for p in procs]
        self.assertTrue(all(p.returncode == 0 for p in procs), lines)
        actions = sorted(line[0] for line in lines)
        self.assertEqual(actions.count("loaded"), 1, lines)
        self.assertEqual(len({line[1] for line in lines}), 1, lines)
        self.assertTrue(all(line[1] == line[2] for line in lines), lines)
        loads = [l for l in self.client.metrics().splitlines() if l.startswith("ckptd_loads_total ")]
        self.assertEqual(loads, ["ckptd_loads_total 1"])

    def test_current_changed_and_other_path(self):
        path = self.write("a.safetensors", 2)
        first = self.client.ensure(path, "a")
        self.assertEqual(first["action"], "loaded")
        self.assertEqual(first["evicted"], [])
        self.assertEqual(len(first["source_fingerprint"]), 16)
        again = self.client.ensure(path, "a")
        self.assertEqual(again["action"], "current")
        self.assertEqual(again["generation"], first["generation"])
        self.write("a.safetensors", 3)
        changed = self.client.ensure(path, "a")
        self.assertEqual(changed["action"], "reloaded")
        self.assertGreater(changed["generation"], first["generation"])
        other = self.write("b.safetensors", 4)
        with self.assertRaisesRegex(ckpt.FailedPrecondition, "is loaded from"):
            self.client.ensure(other, "a")
        self.assertEqual(self.client.list()[0]["source"], path)

    def test_load_returns_what_the_budget_evicted(self):
        self.daemon.stop()
        self.daemon.proc = subprocess.Popen(
            [os.environ["CKPTD_BIN"], "--socket", self.daemon.socket, "--shm-prefix", self.daemon.prefix,
             "--state-dir", os.path.join(self.tmp.name, "state"), "--cleanup-on-exit", "--memory-budget", "10M"],
            stdout=self.daemon.log, stderr=self.daemon.log)
        self.client = ckpt.connect(self.daemon.socket, wait=10)
        small = self.write("s.safetensors", 5, mib=4)
        big = self.write("g.safetensors", 6, mib=7)
        self.assertEqual(self.client.load(small, "s")["evicted"], [])
        self.assertEqual(self.client.load(big, "g")["evicted"], ["s"])
        self.assertEqual(self.client.ensure(small, "s")["evicted"], ["g"])


if __name__ == "__main__":
    unittest.main()
