"""ckpt.dcp against the real daemon with Debian's torch 1.13 (torch.distributed._shard.
checkpoint): one process without a process group, and 2 gloo processes (with
torchrun's environment) saving a ShardedTensor + replicated tensors + a non-tensor as one
generation, read back by 2, 3 and 1 processes; a rank that fails fails the whole save."""
import copyreg
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

import ckpt
import ckpt.dcp
from test_ckpt import Daemon

from dcp_compat import CheckpointException, DefaultSavePlanner, load, save

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

    def _default_metadata(self):
        try:
            from torch.distributed.checkpoint.default_planner import _create_default_local_metadata
        except ImportError:
            from torch.distributed._shard.checkpoint.default_planner import _create_default_local_metadata
        md = _create_default_local_metadata({"w": torch.zeros(2, 3, dtype=torch.bfloat16), "step": 1})
        md.planner_data = {"w": ("w",), "opt.0.lr": ("opt", 0, "lr")}  # what flatten_state_dict maps
        return md

    def test_new_saves_store_the_metadata_as_json_data_only(self):
        save(self.state_dict(), ckpt.dcp.StorageWriter("dcp-json", self.client))
        c = self.client.attach("dcp-json")
        self.assertIn(ckpt.dcp.METADATA_FILE, c.side_files)
        self.assertNotIn(ckpt.dcp.LEGACY_METADATA_FILE, c.side_files)
        doc = json.loads(c.side_file(ckpt.dcp.METADATA_FILE))
        self.assertEqual(doc["format"], "ckpt.dcp.metadata")
        self.assertEqual(doc["state_dict_metadata"]["norm"]["tensor"]["dtype"], "bfloat16")
        self.assertEqual(doc["state_dict_metadata"]["step"], {"bytes": {}})
        md = self._default_metadata()
        self.assertEqual(ckpt.dcp._decode_metadata(ckpt.dcp._encode_metadata(md)), md)

    def test_a_planner_with_objects_in_its_metadata_fails_the_save_clearly(self):
        class Planner(DefaultSavePlanner):
            def create_global_plan(self, all_plans):
                plans, md = super().create_global_plan(all_plans)
                md.planner_data = {"w": os.system}  # not data
                self.metadata = md
                return plans, md
        with self.assertRaises(CheckpointException) as cm:
            save(self.state_dict(), ckpt.dcp.StorageWriter("dcp-objects", self.client), planner=Planner())
        self.assertIn("cannot be stored as data", str(cm.exception))
        self.assertNotIn("dcp-objects", [s["name"] for s in self.client.list()])

    def test_malformed_json_metadata_is_corrupt_naming_the_cause(self):
        good = json.loads(ckpt.dcp._encode_metadata(self._default_metadata()))
        w = good["state_dict_metadata"]["w"]["tensor"]

        def variant(path, value):
            doc = json.loads(json.dumps(good))
            obj = doc
            for k in path[:-1]:
                obj = obj[k]
            obj[path[-1]] = value
            return json.dumps(doc).encode()
        cases = [
            (b"\xff\xfe{", "not UTF-8"),
            (b'{"a":' * 100000 + b"1" + b"}" * 100000, "nested too deeply"),
            (b"[" * 100000, "nested too deeply"),
            (b"{\"format\": 1", "not JSON"),
            (json.dumps({"format": "pickle"}).encode(), "not a ckpt.dcp.metadata document"),
            (variant(["version"], 2), "version is 2"),
            (variant(["state_dict_metadata", "w", "tensor", "dtype"], "os.system"), "dtype 'os.system'"),
            (variant(["state_dict_metadata", "w", "tensor", "dtype"], "__class__"), "dtype '__class__'"),
            (variant(["state_dict_metadata", "w", "tensor", "size"], [2, "3"]), "not a list of integers"),
            (variant(["state_dict_metadata", "w", "tensor", "size"], [2, 1 << 200]), "not a list of integers"),
            (variant(["state_dict_metadata", "w", "tensor", "size"], [2, -3]), "not a list of integers"),
            (variant(["state_dict_metadata", "w", "tensor", "chunks"], [{"offsets": [1, 0], "sizes": [2, 3]}]),
             "outside its size"),
            (variant(["state_dict_metadata", "w", "tensor", "requires_grad"], "yes"), "not a bool"),
            (variant(["state_dict_metadata", "w"], {"pickle": "cos\nsystem"}), "entry 'w'"),
            (variant(["planner_data"], {"call": ["os.system", "id"]}), "not a value of this format"),
            (variant(["planner_data"], {"tuple": [{"tuple": []}] * 2} if False else
                     json.loads("{\"tuple\": [" * 200 + "]}" * 200)), "nested deeper than"),
            (variant(["planner_data"], {"dict": [[[1], 2]]}), "not hashable"),
        ]
        self.assertEqual(len(w["chunks"]), 1)
        for raw, needle in cases:
            with self.assertRaises(ckpt.Corrupt, msg=needle) as cm:
                ckpt.dcp._decode_metadata(raw, "checkpoint 'x'")
            self.assertIn(needle, str(cm.exception))
            self.assertIn("checkpoint 'x'", str(cm.exception))

    def _publish_metadata(self, name, fname, raw):
        self.client.publish(name, {"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, side_files={fname: raw},
                            replace=True)

    def test_legacy_pickled_metadata_still_loads(self):
        sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 7}
        save(sd, ckpt.dcp.StorageWriter("dcp-legacy-src", self.client))
        md = ckpt.dcp._decode_metadata(self.client.attach("dcp-legacy-src").side_file(ckpt.dcp.METADATA_FILE))
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            self.assertEqual(ckpt.dcp._load_legacy_metadata(pickle.dumps(md, protocol=protocol)), md, protocol)
        # A generation as an earlier ckpt.dcp wrote it: the tensors plus the pickled metadata.
        c = self.client.attach("dcp-legacy-src")
        tensors = {k: c.tensor(k).clone() for k in c.keys()}
        del c
        self.client.publish("dcp-legacy", tensors, side_files={ckpt.dcp.LEGACY_METADATA_FILE: pickle.dumps(md)})
        target = {"w": torch.zeros(2, 3), "step": 0}
        load(target, ckpt.dcp.StorageReader("dcp-legacy", self.client))
        self.assertTrue(torch.equal(target["w"], sd["w"]))
        self.assertEqual(target["step"], 7)

    def test_crafted_legacy_pickles_run_no_code(self):
        marker = os.path.join(self.tmp.name, "pwned")
        cmd = ("touch " + marker).encode()

        def s(text):  # SHORT_BINUNICODE
            b = text.encode()
            return b"\x8c" + bytes([len(b)]) + b

        class Evil:
            def __init__(self, *call):
                self.call = call

            def __reduce__(self):
                return self.call
        proto4 = b"\x80\x04"
        reduced = {  # pickled before the extension code below exists
            "__reduce__ os.system": pickle.dumps(Evil(os.system, ("touch " + marker,)), protocol=4),
            "__reduce__ subprocess": pickle.dumps(Evil(subprocess.call, (["touch", marker],)), protocol=5),
            "__reduce__ getattr": pickle.dumps(Evil(getattr, (torch.Size, "__class__")), protocol=4),
        }
        ext_code = 0xF1
        copyreg.add_extension("posix", "system", ext_code)
        try:
            pickle.dumps(os.system, protocol=2)  # fills copyreg's extension cache for the code
            ext_pickle = b"\x80\x02\x82" + bytes([ext_code]) + b"X" + len(cmd).to_bytes(4, "little") + cmd + \
                b"\x85R."
            crafted = {
                # The finding: protocol 4 resolves dotted names under an allowed prefix.
                "dotted STACK_GLOBAL": proto4 + s("torch.distributed.distributed_c10d") + s("os.system") +
                b"\x93" + s(cmd.decode()) + b"\x85R.",
                "dotted name across modules": proto4 + s("torch.distributed") + s("distributed_c10d.os.system") +
                b"\x93" + s(cmd.decode()) + b"\x85R.",
                "dotted name under an allowed class": proto4 + s("torch.distributed.checkpoint.metadata") +
                s("Metadata.__init__.__globals__") + b"\x93.",
                "nested name on torch": proto4 + s("torch") + s("Size.__class__") + b"\x93.",
                "GLOBAL os.system": b"cos\nsystem\n(V" + cmd + b"\ntR.",
                "GLOBAL posix.system": b"cposix\nsystem\n(V" + cmd + b"\ntR.",
                "getattr of the enum": proto4 + s("builtins") + s("getattr") + b"\x93" +
                s("torch.distributed._shard.sharded_tensor.metadata") + s("MEM_FORMAT_ENCODING") + b"\x93" +
                s("__class__") + b"\x86R.",
                "INST": b"(V" + cmd + b"\nios\nsystem\n.",
                "OBJ": b"(cos\nsystem\nV" + cmd + b"\no.",
                "NEWOBJ of a record with arguments": proto4 + s("torch.distributed.checkpoint.metadata") +
                s("Metadata") + b"\x93" + s(cmd.decode()) + b"\x85\x81.",
                "REDUCE of a record": proto4 + s("torch.distributed.checkpoint.metadata") + s("Metadata") +
                b"\x93)R.",
                "BUILD on a global": proto4 + s("torch") + s("Size") + b"\x93N}" + s("__defaults__") +
                b"\x8c\x01x\x85s\x86b.",
                "persistent id": b"P" + cmd + b"\n.",
                "binary persistent id": proto4 + s(cmd.decode()) + b"Q.",
                "extension code": ext_pickle,
                "out-of-band buffer": b"\x80\x05\x97.",
                "torch.load": proto4 + s("torch") + s("load") + b"\x93.",
                "a list where Metadata belongs": pickle.dumps([1, 2]),
                **reduced,
            }
            for what, raw in crafted.items():
                with self.assertRaises(ckpt.Corrupt, msg=what) as cm:
                    ckpt.dcp._load_legacy_metadata(raw, "checkpoint 'x'")
                self.assertIn(ckpt.dcp.LEGACY_METADATA_FILE, str(cm.exception))
                self.assertFalse(os.path.exists(marker), what)
            # Through DCP's own load of a real generation: refused, nothing runs.
            self._publish_metadata("dcp-evil", ckpt.dcp.LEGACY_METADATA_FILE, crafted["dotted STACK_GLOBAL"])
            with self.assertRaises((ckpt.Corrupt, CheckpointException)) as cm:
                load({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, ckpt.dcp.StorageReader("dcp-evil", self.client))
            self.assertIn("not allowed", str(cm.exception))
            self.assertFalse(os.path.exists(marker))
        finally:
            copyreg.remove_extension("posix", "system", ext_code)
        self.assertEqual(self.client.attach("dcp-evil").tensor("w").shape, (2, 3))  # daemon serving

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
