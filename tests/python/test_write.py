"""The write path from Python (issue 15) against the real ckptd, with Debian's torch 1.13 on
the CPU: Client.publish of many dtypes and layouts, the multi-rank Writer in real
processes (launcher variables, boxes and ZeRO flat partitions), readers taking another
sharding, and writers or ranks that die, raise or abort."""
import gc
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch

import ckpt
from test_ckpt import Daemon, ds_partition


def segments(daemon):
    d = daemon.segment_dir()
    return sorted(os.listdir(d)) if d and os.path.isdir(d) else []


RANK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch, ckpt
    sock, mode, name = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    w_full = torch.randn(64, 48)
    z_full = torch.randn(1000)
    client = ckpt.connect(sock)
    w = client.writer(name, timeout=float(os.environ.get("WRITE_TIMEOUT", "60")))
    assert (w.part, w.parts) == (rank, world), (w.part, w.parts)
    rows = 64 // world
    # rank's rows of w, as a non-contiguous view (a column-major copy, transposed back)
    end_row = 64 if rank == world - 1 else (rank + 1) * rows
    mine = w_full[rank * rows:end_row].t().contiguous().t()
    if mode == "die" and rank == world - 1:
        w._filler = lambda t: (lambda *a: os.kill(os.getpid(), signal.SIGKILL))
    w.add("w", mine, global_shape=(64, 48), offsets=(rank * rows, 0))
    per = -(-1000 // world)
    start, end = min(1000, rank * per), min(1000, (rank + 1) * per)
    w.add_flat("z", z_full[start:end], global_shape=(1000,), start=start)
    if rank == 0:
        w.side_file("config.json", b'{"model_type": "test"}')
    try:
        summary = w.commit()
        print("OK", summary["generation"], flush=True)
    except ckpt.CkptError as e:
        print("ERROR", type(e).__name__, e, flush=True)
""")


class WriteTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.script = os.path.join(cls.tmp.name, "rank.py")
        with open(cls.script, "w") as f:
            f.write(RANK_SCRIPT)

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        gc.collect()
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def assertNothingLeft(self, name):
        self.assertNotIn(name, [c["name"] for c in self.client.list()])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            st = self.client.status()
            if st["loading"] == 0 and st["memory_used_bytes"] == self._used_before and \
                    not [s for s in segments(self.daemon) if s.startswith(name + ".")]:
                return
            time.sleep(0.02)
        self.fail(f"'{name}' left something: {self.client.status()} {segments(self.daemon)}")

    def setUp(self):
        self._used_before = self.client.status()["memory_used_bytes"]

    def test_publish_many_dtypes_and_layouts_from_the_cpu(self):
        g = torch.Generator().manual_seed(5)
        base = torch.randn(30, 20, generator=g)
        sd = {
            "f32": base,
            "bf16": base.to(torch.bfloat16),
            "f16": base[:, :7].to(torch.float16),          # a non-contiguous slice
            "f64.t": base.double().t(),                     # transposed
            "step": base[::3, 1::2],                        # strided both ways
            "i8": torch.randint(-128, 127, (17,), dtype=torch.int8, generator=g),
            "i64": torch.arange(11, dtype=torch.int64),
            "bool": torch.rand(9, generator=g) > 0.5,
            "c64": torch.randn(4, 3, dtype=torch.complex64, generator=g),
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 5),
            "expanded": torch.ones(1, 4).expand(3, 4),      # stride 0
        }
        summary = self.client.publish("many", sd, side_files={"config.json": b'{"a": 1}'})
        self.assertEqual(summary["tensor_count"], len(sd))
        self.assertEqual(summary["format"], "published")
        c = self.client.attach("many")
        self.assertEqual(list(c.keys()), list(sd))
        for k, v in sd.items():
            got = c.tensor(k)
            self.assertEqual(got.dtype, v.dtype, k)
            self.assertEqual(tuple(got.shape), tuple(v.shape), k)
            self.assertTrue(torch.equal(got, v), k)
        self.assertEqual(c.side_file("config.json"), b'{"a": 1}')
        c.verify()
        self.assertTrue(self.client.verify("many")["passed"])

    def test_a_name_in_use_needs_replace(self):
        first = self.client.publish("again", {"t": torch.ones(3)})
        with self.assertRaises(ckpt.AlreadyExists):
            self.client.publish("again", {"t": torch.zeros(3)})
        self.assertTrue(torch.equal(self.client.attach("again").tensor("t"), torch.ones(3)))
        second = self.client.publish("again", {"t": torch.zeros(3)}, replace=True)
        self.assertGreater(second["generation"], first["generation"])
        self.assertTrue(torch.equal(self.client.attach("again").tensor("t"), torch.zeros(3)))

    def test_an_exception_while_staging_fails_the_write_and_propagates(self):
        calls = []

        def boom(*a):
            calls.append(a)
            raise ValueError("staging failed on purpose")
        w = self.client.writer("raises", part=0, parts=1)
        w.add("a", torch.ones(1000))
        w._filler = lambda t: boom  # the second tensor's staging raises
        w.add("b", torch.ones(1000))
        with self.assertRaises(ValueError):
            w.commit()
        self.assertTrue(calls)
        self.assertNothingLeft("raises")
        # An aborted writer publishes nothing either.
        w = self.client.writer("raises", part=0, parts=1)
        w.add("a", torch.ones(1000))
        w.abort()
        with self.assertRaises(ckpt.Cancelled):
            w.commit()
        self.assertNothingLeft("raises")

    def run_ranks(self, world, mode, name, timeout="60"):
        env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + world),
                   TORCHELASTIC_RUN_ID=f"run-{mode}-{os.getpid()}", WRITE_TIMEOUT=timeout)
        env.pop("LOCAL_RANK", None)
        procs = [subprocess.Popen([sys.executable, self.script, self.daemon.socket, mode, name],
                                  env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for r in range(world)]
        out = []
        for p in procs:
            o, e = p.communicate(timeout=120)
            out.append((p.returncode, o.strip(), e.strip()))
        return out

    def test_four_ranks_write_one_generation_that_two_column_ranks_and_a_zero_world_read(self):
        out = self.run_ranks(4, "ok", "trained")
        for rc, o, e in out:
            self.assertEqual(rc, 0, e)
            self.assertTrue(o.startswith("OK"), (o, e))
        self.assertEqual(len({o for _, o, _ in out}), 1, "every rank got the same generation")
        torch.manual_seed(0)
        w_full = torch.randn(64, 48)
        z_full = torch.randn(1000)
        c = self.client.attach("trained")
        self.assertTrue(torch.equal(c.tensor("w"), w_full))
        self.assertTrue(torch.equal(c.tensor("z"), z_full))
        self.assertEqual(c.side_file("config.json"), b'{"model_type": "test"}')
        # Written as 4 row blocks; read as TP=2 column shards and ZeRO-3 partitions of 3.
        for rank in range(2):
            got = c.shard("w", ckpt.row(), rank, 2, copy=True)
            self.assertTrue(torch.equal(got, w_full[:, rank * 24:(rank + 1) * 24]), rank)
        for rank in range(3):
            self.assertTrue(torch.equal(c.partition("z", rank, 3), ds_partition(z_full, rank, 3)), rank)
            self.assertTrue(torch.equal(c.partition("w", rank, 3), ds_partition(w_full, rank, 3)), rank)
        c.verify()

    def test_a_rank_killed_mid_write_fails_the_generation_for_every_rank(self):
        out = self.run_ranks(3, "die", "dead", timeout="20")
        self.assertEqual(out[2][0], -signal.SIGKILL)
        for rc, o, e in out[:2]:
            self.assertEqual(rc, 0, e)
            self.assertTrue(o.startswith("ERROR"), (o, e))
            self.assertIn("part 2", o)
            self.assertIn("nothing was published", o)
        self.assertNothingLeft("dead")

    def test_a_writer_killed_before_publishing_leaves_nothing(self):
        code = textwrap.dedent(f"""
            import os, signal, torch, ckpt
            c = ckpt.connect({self.daemon.socket!r})
            w = c.writer("doomed", part=0, parts=1)
            w.add("a", torch.ones(4 << 20))
            state = {{"n": 0}}
            real = w._filler
            def filler(t):
                f = real(t)
                def fill(*a):
                    f(*a)
                    state["n"] += 1
                    if state["n"] == 1:
                        print("streaming", flush=True)
                        signal.pause()
                return fill
            w._filler = filler
            w.add("b", torch.ones(4 << 20))
            w.commit()
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        self.addCleanup(p.stdout.close)
        self.assertEqual(p.stdout.readline().strip(), "streaming")
        st = self.client.status()
        self.assertEqual(st["loading"], 1)
        self.assertEqual(len([s for s in segments(self.daemon) if s.startswith("doomed.")]), 1)
        p.kill()
        p.wait()
        self.assertNothingLeft("doomed")


if __name__ == "__main__":
    unittest.main()
