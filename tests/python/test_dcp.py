"""ckpt.dcp against the real daemon with Debian's torch 1.13 (torch.distributed._shard.
checkpoint): one process without a process group, and 2 gloo processes (with
torchrun's environment) saving a ShardedTensor + replicated tensors + a non-tensor as one
generation, read back by 2, 3 and 1 processes; a rank that fails fails the whole save."""
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

import ckpt
import ckpt.dcp
from test_ckpt import Daemon

from dcp_compat import CheckpointException, load, save

HERE = os.path.dirname(os.path.abspath(__file__))


class DcpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def state_dict(self):
        g = torch.Generator().manual_seed(1)
        return {"emb": torch.randn(16, 8, generator=g), "norm": torch.randn(8, generator=g).to(torch.bfloat16),
                "ids": torch.arange(6).reshape(2, 3), "scalar": torch.tensor(2.5),
                "step": 42, "extra": {"lr": 0.125, "betas": (0.9, 0.95)}}

    def test_single_process_round_trip(self):
        sd = self.state_dict()
        writer = ckpt.dcp.StorageWriter("dcp-single", self.client)
        save(sd, writer)
        self.assertEqual(writer.summary["name"], "dcp-single")
        c = self.client.attach("dcp-single")
        self.assertIn(ckpt.dcp.METADATA_FILE, c.side_files)
        # Tensors are stored whole under their keys: any ckpt reader can take them.
        self.assertTrue(torch.equal(c.tensor("emb"), sd["emb"]))
        self.assertIn(ckpt.dcp.BYTES_PREFIX + "step", c.keys())
        del c
        target = {"emb": torch.zeros(16, 8), "norm": torch.zeros(8, dtype=torch.bfloat16),
                  "ids": torch.zeros(2, 3, dtype=torch.int64), "scalar": torch.tensor(0.0), "step": 0,
                  "extra": {"lr": 0.0, "betas": None}}
        load(target, ckpt.dcp.StorageReader("dcp-single", self.client))
        for k in ("emb", "norm", "ids", "scalar"):
            self.assertTrue(torch.equal(target[k], sd[k]), k)
        self.assertEqual(target["step"], 42)
        self.assertEqual(target["extra"], {"lr": 0.125, "betas": (0.9, 0.95)})

    def test_a_taken_name_fails_and_replace_publishes_a_new_generation(self):
        sd = self.state_dict()
        save(sd, ckpt.dcp.StorageWriter("dcp-gen", self.client))
        first = self.client.attach("dcp-gen").generation
        with self.assertRaises(CheckpointException) as cm:  # DCP wraps each rank's error
            save(sd, ckpt.dcp.StorageWriter("dcp-gen", self.client))
        self.assertIn("dcp-gen", str(cm.exception))
        self.assertEqual(self.client.attach("dcp-gen").generation, first)
        sd["emb"] += 1
        save(sd, ckpt.dcp.StorageWriter("dcp-gen", self.client, replace=True))
        c = self.client.attach("dcp-gen")
        self.assertGreater(c.generation, first)
        self.assertTrue(torch.equal(c.tensor("emb"), sd["emb"]))

    def test_persist_dir_writes_safetensors_with_the_metadata_beside(self):
        out = os.path.join(self.tmp.name, "dcp-disk")
        save(self.state_dict(), ckpt.dcp.StorageWriter("dcp-disk", self.client, persist_dir=out))
        self.assertEqual(sorted(os.listdir(out)), [ckpt.dcp.METADATA_FILE, "model.safetensors"])

    def test_a_generation_not_saved_by_dcp_is_a_clear_error(self):
        path = os.path.join(self.tmp.name, "plain.safetensors")
        subprocess.run([sys.executable, os.path.join(os.environ["CKPT_TOOLS_DIR"], "make_checkpoint.py"), path,
                        "--mib", "1", "--layers", "1"], check=True, stdout=subprocess.DEVNULL)
        self.client.load(path, "plain")
        with self.assertRaises(ckpt.NotFound):
            ckpt.dcp.StorageReader("plain", self.client).read_metadata()

    def test_the_metadata_unpickler_refuses_anything_but_metadata(self):
        import io
        import pickle

        class Evil:
            def __init__(self, *call):
                self.call = call

            def __reduce__(self):
                return self.call

        marker = os.path.join(self.tmp.name, "pwned")
        for evil in (Evil(os.system, ("touch " + marker,)),
                     Evil(getattr, (torch.Size, "__class__")),        # getattr only for enum members
                     Evil(subprocess.call, (["touch", marker],))):
            with self.assertRaises(pickle.UnpicklingError):
                ckpt.dcp._MetadataUnpickler(io.BytesIO(pickle.dumps(evil))).load()
        self.assertFalse(os.path.exists(marker))
        # What DCP itself writes goes through.
        try:
            from torch.distributed.checkpoint.default_planner import _create_default_local_metadata
        except ImportError:
            try:
                from torch.distributed._shard.checkpoint.default_planner import _create_default_local_metadata
            except ImportError:
                self.skipTest("this torch has no _create_default_local_metadata")
        md = _create_default_local_metadata({"w": torch.zeros(2, 3, dtype=torch.bfloat16), "step": 1})
        back = ckpt.dcp._MetadataUnpickler(io.BytesIO(pickle.dumps(md))).load()
        self.assertEqual(back.state_dict_metadata, md.state_dict_metadata)

    def run_ranks(self, world, mode, name):
        """Starts `world` ranks of dcp_worker.py with the environment torchrun gives them
        (torch.distributed.run itself does not start under Debian's torch 1.13 on Python
        3.11: its elastic agent fails in to_map), gloo over 127.0.0.1."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(world):
            env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "dcp_worker.py"), mode, name,
                                           self.daemon.socket], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=240) for p in procs]
        return subprocess.CompletedProcess([], max(p.returncode for p in procs), "".join(o for o, _ in outs),
                                           "".join(e for _, e in outs))

    def test_two_gloo_ranks_save_one_generation_any_world_reads_it(self):
        r = self.run_ranks(2, "save", "dcp-multi")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sorted(l for l in r.stdout.splitlines() if l.startswith("RANK")), ["RANK 0 OK", "RANK 1 OK"])
        c = self.client.attach("dcp-multi")
        self.assertTrue(torch.equal(c.tensor("layer.w"), torch.arange(48, dtype=torch.float32).reshape(12, 4) / 7))
        del c
        for world in (2, 3):
            r = self.run_ranks(world, "load", "dcp-multi")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(len([l for l in r.stdout.splitlines() if l.endswith(" OK")]), world)
        # One process, no process group, plain tensors as targets.
        target = {"layer.w": torch.zeros(12, 4), "bias": torch.zeros(5, dtype=torch.bfloat16), "step": 0}
        load(target, ckpt.dcp.StorageReader("dcp-multi", self.client))
        self.assertTrue(torch.equal(target["layer.w"], torch.arange(48, dtype=torch.float32).reshape(12, 4) / 7))
        self.assertEqual(target["step"], 1234)

    def test_a_failing_rank_fails_the_whole_save(self):
        r = self.run_ranks(2, "fail", "dcp-fail")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sorted(l.split(" FAILED")[0] for l in r.stdout.splitlines() if " FAILED " in l),
                         ["RANK 0", "RANK 1"])
        self.assertNotIn("dcp-fail", [s["name"] for s in self.client.list()])


if __name__ == "__main__":
    unittest.main()
