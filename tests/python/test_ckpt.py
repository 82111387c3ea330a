"""Tests of the `ckpt` Python module against the real ckptd, on checkpoints written by
PyTorch. Run by ctest (tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import ckpt

CKPTD = os.environ["CKPTD_BIN"]
TOOLS = os.environ["CKPT_TOOLS_DIR"]
sys.path.insert(0, TOOLS)
import make_checkpoint  # noqa: E402  (the same writer the C++ tests use)


def ds_partition(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """DeepSpeed ZeRO-3's partitioning (deepspeed/runtime/zero/partition_parameters.py,
    _partition_param): pad numel up to a multiple of world, each rank takes one slice."""
    numel = t.numel()
    remainder = numel % world
    padded = numel + ((world - remainder) if remainder else 0)
    partition_size = padded // world
    start = partition_size * rank
    end = start + partition_size
    flat = t.contiguous().view(-1)
    out = torch.zeros(partition_size, dtype=t.dtype)
    if start < numel:
        n = min(end, numel) - start
        out[:n] = flat[start:start + n]
    return out


class Daemon:
    def __init__(self, workdir):
        self.workdir = workdir
        self.socket = os.path.join(workdir, "ckptd.sock")
        self.prefix = f"ckptpy{os.getpid()}x{int(time.time() * 1000) % 100000}"
        self.log = open(os.path.join(workdir, "ckptd.log"), "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([CKPTD, "--socket", self.socket, "--shm-prefix", self.prefix,
                                      "--state-dir", os.path.join(self.workdir, "state"),
                                      "--cleanup-on-exit"], stdout=self.log, stderr=self.log)
        ckpt.connect(self.socket, wait=10)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def segment_dir(self):
        """The daemon's segment directory, /dev/shm/<prefix>.<random>, named in its state
        directory ("" before it made one)."""
        try:
            with open(os.path.join(self.workdir, "state", "segment-directory")) as f:
                return os.path.join("/dev/shm", f.read().strip())
        except FileNotFoundError:
            return ""

    def cleanup(self):
        self.stop()
        self.log.close()
        if self.segment_dir():
            shutil.rmtree(self.segment_dir(), ignore_errors=True)


class CkptModuleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.sd = make_checkpoint.gpt_state_dict(mib=6, layers=2, seed=3)
        cls.path = os.path.join(cls.tmp.name, "gpt.safetensors")
        make_checkpoint.write_safetensors(cls.path, cls.sd)
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        events = []
        cls.summary = cls.client.load(cls.path, "gpt", progress=lambda d, t: events.append((d, t)))
        cls.events = events

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        gc.collect()
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_load_summary_and_progress(self):
        self.assertEqual(self.summary["name"], "gpt")
        self.assertEqual(self.summary["tensor_count"], len(self.sd))
        self.assertTrue(self.events, "progress callback never called")
        done = [d for d, _ in self.events]
        self.assertEqual(done, sorted(done))
        self.assertEqual(self.events[-1][0], self.events[-1][1])
        self.assertEqual(self.events[-1][1], self.summary["data_bytes"])

    def test_views_are_zero_copy_and_equal(self):
        c = self.client.attach("gpt")
        for name, ref in self.sd.items():
            t = c.tensor(name)
            self.assertEqual(t.dtype, ref.dtype, name)
            self.assertEqual(tuple(t.shape), tuple(ref.shape), name)
            self.assertTrue(torch.equal(t, ref), name)
        a, b = c.tensor("wte.weight"), c.tensor("wte.weight")
        self.assertEqual(a.data_ptr(), b.data_ptr(), "views of one tensor share memory")
        c.verify()

    def test_views_keep_the_attachment_alive(self):
        view = self.client.attach("gpt").tensor("h.1.attn.qkv.weight")
        gc.collect()
        self.assertEqual(self.client.list()[0]["attached"], 1)
        self.assertTrue(torch.equal(view, self.sd["h.1.attn.qkv.weight"]))
        del view
        gc.collect()
        for _ in range(200):
            if self.client.list()[0]["attached"] == 0:
                break
            time.sleep(0.01)
        self.assertEqual(self.client.list()[0]["attached"], 0)

    def test_tensor_parallel_state_dicts_match_torch_slicing(self):
        plan = {r"attn\.qkv\.weight$": ckpt.fused(3, 0), r"attn\.qkv\.bias$": ckpt.fused(3, 0),
                r"out_proj\.weight$": ckpt.row(), r"c_fc\.weight$": ckpt.column(), r"c_proj\.weight$": ckpt.row(),
                r"^wte\.weight$": ckpt.column()}
        world = 4
        for rank in range(world):
            sd = self.client.state_dict("gpt", rank, world, plan)
            self.assertEqual(set(sd), set(self.sd))
            for name, ref in self.sd.items():
                if "qkv" in name:
                    want = torch.cat([torch.chunk(c, world, 0)[rank] for c in torch.chunk(ref, 3, 0)], 0)
                elif name.endswith("out_proj.weight") or name.endswith("c_proj.weight"):
                    want = torch.chunk(ref, world, -1)[rank]
                elif name.endswith("c_fc.weight") or name == "wte.weight":
                    want = torch.chunk(ref, world, 0)[rank]
                else:
                    want = ref
                self.assertEqual(sd[name].dtype, want.dtype, name)
                self.assertTrue(torch.equal(sd[name], want), f"{name} rank {rank}")

    def test_dtype_conversion_only_touches_floats(self):
        sd = self.client.state_dict("gpt", dtype=torch.bfloat16, copy=True)
        self.assertEqual(sd["wte.weight"].dtype, torch.bfloat16)
        self.assertTrue(torch.equal(sd["wte.weight"], self.sd["wte.weight"].to(torch.bfloat16)))
        self.assertEqual(sd["position_ids"].dtype, torch.int64)
        self.assertEqual(sd["token_type_mask"].dtype, torch.bool)

    def test_zero3_partitions_match_deepspeed(self):
        c = self.client.attach("gpt")
        for world in (1, 3, 4, 7):
            for rank in range(world):
                parts = c.partitions(rank, world)
                for name, ref in self.sd.items():
                    self.assertTrue(torch.equal(parts[name], ds_partition(ref, rank, world)),
                                    f"{name} rank {rank}/{world}")
        # The partitions of all ranks put back together are the tensor.
        ref = self.sd["h.0.attn.qkv.bias"]
        whole = torch.cat([c.partition("h.0.attn.qkv.bias", r, 5) for r in range(5)])[:ref.numel()]
        self.assertTrue(torch.equal(whole, ref))

    def test_mics_partitions_repeat_across_shard_groups(self):
        c = self.client.attach("gpt")
        world, group = 8, 4
        for rank in range(world):
            got = c.partition("h.1.mlp.c_fc.weight", rank, world, group_size=group)
            want = ds_partition(self.sd["h.1.mlp.c_fc.weight"], rank % group, group)
            self.assertTrue(torch.equal(got, want), rank)

    def test_bad_arguments_raise_clear_errors(self):
        c = self.client.attach("gpt")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "rank 4 out of range"):
            c.shard("wte.weight", ckpt.column(), 4, 4)
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot split"):
            c.shard("wte.weight", ckpt.column(), 0, 3)
        with self.assertRaises(ValueError):  # InvalidArgument is a ValueError
            c.partition("wte.weight", 0, 8, group_size=3)
        with self.assertRaisesRegex(ckpt.InvalidArgument, "out of range"):
            c.partition("wte.weight", -1, 8)
        with self.assertRaisesRegex(ckpt.NotFound, "no checkpoint named 'nope'"):
            self.client.attach("nope")
        with self.assertRaises(KeyError):
            c.tensor("no.such.tensor")
        with self.assertRaisesRegex(ckpt.AlreadyExists, "already loaded"):
            self.client.load(self.path, "gpt")
        with self.assertRaisesRegex(ckpt.NotFound, "no such file"):
            self.client.load(self.path + ".missing", "x")

    def test_gpu_engine_without_a_gpu_is_a_clear_error(self):
        c = self.client.attach("gpt")
        if ckpt._ckpt.gpu_available():
            self.skipTest("a GPU is present")
        with self.assertRaisesRegex(ckpt.Unsupported, "CUDA|GPU|driver"):
            c.state_dict(0, 2, {r"out_proj\.weight$": ckpt.row()}, device="cuda:0", engine="gpu")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "unknown plan"):
            c.state_dict(0, 2, "no-such-family", device="cuda:0", engine="gpu")
        self.assertIn("gpt-neo", ckpt._ckpt.plan_families())

    def test_family_plans_work_without_the_engine(self):
        # A family plan on another family's checkpoint used to replicate every tensor
        # silently; it is an error now (issue 16). Every family on the CPU: test_plans.py.
        with self.assertRaisesRegex(ckpt.InvalidArgument, "llama plan needs .*another family"):
            self.client.state_dict("gpt", 1, 2, "llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "unknown plan"):
            self.client.state_dict("gpt", 0, 2, "no-such-family")

    def test_rendezvous_across_threads_returns_rank_zeros_bytes(self):
        import threading
        blob = os.urandom(128)
        got = {}

        def rank(r):
            c = ckpt.connect(self.daemon.socket)
            got[r] = c.rendezvous("py-job:1", r, 2, blob if r == 0 else b"", timeout=30)

        waiter = threading.Thread(target=rank, args=(1,))
        waiter.start()  # before rank 0: it waits, with the GIL released
        time.sleep(0.2)
        rank(0)
        waiter.join(timeout=30)
        self.assertEqual(got, {0: blob, 1: blob})

    def test_rendezvous_timeout_raises_deadline_exceeded(self):
        start = time.monotonic()
        with self.assertRaises(ckpt.DeadlineExceeded) as cm:
            self.client.rendezvous("py-orphan", 1, 2, timeout=0.5)
        self.assertGreaterEqual(time.monotonic() - start, 0.5)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertIn("py-orphan", str(cm.exception))
        with self.assertRaises(ckpt.InvalidArgument):
            self.client.rendezvous("bad job", 0, 2, b"x")

    def test_collective_load_errors_without_a_gpu(self):
        # NCCL unique ids need no GPU; joining a group does, and says so.
        try:
            self.assertEqual(len(ckpt.NcclGroup.unique_id()), 128)
        except ckpt.Unsupported:
            pass  # a build without NCCL
        if ckpt._ckpt.gpu_available():
            self.skipTest("a GPU is present: covered by tests/cuda/collective_test.cc")
        with self.assertRaisesRegex(ckpt.Unsupported, "CUDA|NCCL"):
            ckpt.NcclGroup.create(b"\0" * 128, 0, 2, 0, 1.0)
        with self.assertRaisesRegex(ckpt.Unsupported, "CUDA|NCCL"):
            self.client.nccl_group("py-job", 0, 2, 0, timeout=1.0)
        with self.assertRaisesRegex(ckpt.InvalidArgument, "gpu engine"):
            self.client.attach("gpt").state_dict(0, 1, device="cpu", group=object(), engine="torch")

    def test_raising_progress_callback_cancels_and_the_client_stays_in_step(self):
        # A 1 GiB hole: loads for long enough that the callback is called (every ~100 ms).
        with tempfile.TemporaryDirectory() as d:
            big = os.path.join(d, "big.safetensors")
            header = make_checkpoint.safetensors_header([("big", "F32", [1 << 28], 1 << 30)])
            with open(big, "wb") as f:
                f.write(header)
                f.truncate(len(header) + (1 << 30))

            class Boom(Exception):
                pass

            calls = []

            def boom(done, total):
                calls.append(done)
                raise Boom("stop here")

            for exc, callback in ((Boom, boom), (KeyboardInterrupt, lambda d, t: (_ for _ in ()).throw(KeyboardInterrupt()))):
                with self.assertRaises(exc):
                    self.client.load(big, "big", progress=callback)
                # Nothing published: not listed, not loading, no segment left.
                self.assertNotIn("big", [c["name"] for c in self.client.list()])
                segment_dir = self.daemon.segment_dir()
                self.assertFalse([n for n in os.listdir(segment_dir) if n.startswith("big.")])
                # The next calls get their own answers, not the cancelled load's.
                with self.assertRaises(ckpt.NotFound):
                    self.client.evict("no-such-checkpoint")
                self.assertEqual(self.client.status()["loading"], 0)
            self.assertTrue(calls, "the progress callback was never called")
            # And a load on the same client works.
            again = self.client.load(self.path, "again")
            self.assertEqual(again["name"], "again")
            self.assertIn("again", [c["name"] for c in self.client.list()])
            self.assertEqual(self.client.evict("again")["name"], "again")

    def test_no_daemon_and_daemon_restart(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ckpt.Unavailable, "is the daemon running"):
                ckpt.connect(os.path.join(d, "none.sock"))
            daemon = Daemon(d)
            daemon.start()
            try:
                client = ckpt.connect(daemon.socket)
                client.load(self.path, "r")
                view = client.attach("r").tensor("wte.weight")
                daemon.stop(signal.SIGKILL)
                with self.assertRaises(ckpt.Unavailable):
                    client.list()
                self.assertTrue(torch.equal(view, self.sd["wte.weight"]), "mapping outlives the daemon")
                daemon.start()
                client = ckpt.connect(daemon.socket)
                self.assertEqual([c["name"] for c in client.list()], ["r"], "re-adopted after restart")
            finally:
                daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
