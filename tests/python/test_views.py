"""Copy-on-write views (issue 13) through the Python module, against the real ckptd: a
process writes into zero-copy tensors (Checkpoint.tensor, shard, state_dict(copy=False)):
no crash, it sees its writes, it pays only the pages written; another process, a fresh
attachment, copies, Checkpoint.verify() and the daemon's verify still see the checkpoint's
bytes. Run by ctest (tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ckpt  # noqa: E402  (its Daemon and make_checkpoint; not its test class)

make_checkpoint = test_ckpt.make_checkpoint


def anonymous_bytes_of(address: int) -> int:
    """Anonymous bytes (pages copied on write) of the mapping holding `address` in this
    process, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


class CopyOnWriteViewTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.sd = make_checkpoint.gpt_state_dict(mib=4, layers=2, seed=5)
        cls.path = os.path.join(cls.tmp.name, "gpt.safetensors")
        make_checkpoint.write_safetensors(cls.path, cls.sd)
        cls.daemon = test_ckpt.Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.client.load(cls.path, "gpt")
        cls.big = max(cls.sd, key=lambda n: cls.sd[n].numel() * cls.sd[n].element_size())

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def child(self, code: str) -> subprocess.CompletedProcess:
        """Runs `code` in another Python process attached to the same daemon (a fault there
        shows as a signal in the return code, not as this test runner dying)."""
        prelude = f"import ckpt, torch\nc = ckpt.connect({self.daemon.socket!r}).attach('gpt')\n"
        return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=120, env=os.environ)

    def assert_intact(self):
        """The checkpoint holds its original bytes for everyone else."""
        other = self.client.attach("gpt")
        for name, ref in self.sd.items():
            self.assertTrue(torch.equal(other.tensor(name), ref), name)
            self.assertTrue(torch.equal(other.shard(name, copy=True), ref), name)
        other.verify()
        self.assertTrue(self.client.verify("gpt")["passed"])
        r = self.child(f"""
            ref = c.tensor({self.big!r}).clone()
            print(float(ref.double().sum()))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertAlmostEqual(float(r.stdout), float(self.sd[self.big].double().sum()), places=3)

    def test_a_writer_process_does_not_crash_and_sees_its_writes(self):
        # Before issue 13 this child died of SIGSEGV (-11) at the first in-place op.
        r = self.child(f"""
            t = c.tensor({self.big!r})
            t.add_(1)                                    # every page of the tensor
            w = c.state_dict(copy=False)                 # views too
            first = next(n for n in w if w[n].is_floating_point() and w[n].numel())
            w[first].zero_()
            s = c.shard({self.big!r}, ckpt.column(), 0, 2)   # a contiguous shard: a view
            s.fill_(3)
            assert bool((c.tensor({self.big!r})[:s.shape[0]] == 3).all()), "views of one tensor share the writes"
            assert bool((w[first] == 0).all())
            c.verify()                                   # the shared copy is untouched
            print("ok")
        """)
        self.assertEqual(r.returncode, 0, f"rc {r.returncode}: {r.stderr[-2000:]}")
        self.assertTrue(r.stdout.startswith("ok"), r.stdout)
        self.assert_intact()

    def test_writes_in_this_process_stay_private(self):
        c = self.client.attach("gpt")
        t = c.tensor(self.big)
        ref = self.sd[self.big]
        self.assertTrue(torch.equal(t, ref))
        t.mul_(-2)
        self.assertTrue(torch.equal(t, ref * -2), "the writer sees its write")
        self.assertTrue(torch.equal(c.tensor(self.big), ref * -2), "later views of this attachment too")
        self.assertTrue(torch.equal(c.shard(self.big, copy=True), ref), "copies read the checkpoint")
        sd = c.state_dict(copy=True, names=[self.big])
        self.assertTrue(torch.equal(sd[self.big], ref))
        c.verify()
        self.assert_intact()

    def test_only_the_pages_written_are_copied(self):
        c = self.client.attach("gpt")
        self.assertEqual(c.private_bytes, 0)
        t = c.tensor(self.big)
        flat = t.view(-1).view(torch.uint8)
        self.assertGreater(flat.numel(), 64 * 4096)
        float(t.double().sum())  # reads all of it
        base = flat.data_ptr()
        self.assertEqual(anonymous_bytes_of(base), 0, "reads share the checkpoint's pages")
        page = os.sysconf("SC_PAGE_SIZE")
        start = -base % page
        for i in range(8):
            flat[start + i * page] = 1
        got = anonymous_bytes_of(base)
        self.assertGreaterEqual(got, 8 * page)
        self.assertLessEqual(got, 8 * page + 2 * 2**20, "only the pages written (huge pages aside)")
        self.assertEqual(c.private_bytes, got, "Checkpoint.private_bytes is what the kernel counts")

    def test_buffer_is_writable_and_the_mapping_outlives_the_checkpoint(self):
        c = self.client.attach("gpt")
        t = c.tensor(self.big)
        del c
        import gc
        gc.collect()
        t[0] = 42  # the view keeps its (private) mapping alive
        self.assertEqual(float(t.view(-1)[0] if t.dim() else t), 42.0)


if __name__ == "__main__":
    unittest.main()
