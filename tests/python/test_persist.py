"""Client.persist from Python against the real daemon: a torch state dict written by
torch-made safetensors, persisted (one file and sharded), read back by hand and by
`load`, the same bytes; progress, and an exception from it cancels with nothing left."""
import json
import os
import struct
import tempfile
import unittest

import torch

import ckpt
from test_ckpt import Daemon, make_checkpoint


def read(path):
    with open(path, "rb") as f:
        return f.read()


def read_safetensors(path):
    data = read(path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for k, v in header.items():
        if k != "__metadata__":
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], data[8 + n + b:8 + n + e])
    return header.get("__metadata__"), out


class PersistTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.daemon.start()
        self.client = ckpt.connect(self.daemon.socket)
        g = torch.Generator().manual_seed(3)
        self.sd = {"emb": torch.randn(64, 32, generator=g), "h.0.w": torch.randn(32, 32, generator=g).to(torch.bfloat16),
                   "pos": torch.arange(10), "half": torch.randn(5, generator=g).half()}
        make_checkpoint.write_safetensors(os.path.join(self.tmp.name, "m.safetensors"), self.sd,
                                          {"format": "pt", "epoch": "3"})
        self.client.load(os.path.join(self.tmp.name, "m.safetensors"), "m")

    def tearDown(self):
        self.client = None
        self.daemon.cleanup()
        self.tmp.cleanup()

    def test_round_trip_single_file_and_sharded(self):
        out = os.path.join(self.tmp.name, "out")
        ticks = []
        r = self.client.persist("m", out, progress=lambda d, t: ticks.append((d, t)))
        self.assertEqual(r["files"], ["model.safetensors"])
        self.assertTrue(ticks and ticks[-1][0] == ticks[-1][1] == r["bytes_written"])
        md, tensors = read_safetensors(os.path.join(out, "model.safetensors"))
        self.assertEqual(md, {"format": "pt", "epoch": "3"})
        for k, t in self.sd.items():
            self.assertEqual(tensors[k][1], list(t.shape))
            self.assertEqual(tensors[k][2], t.contiguous().view(torch.uint8).numpy().tobytes(), k)
        self.client.load(out, "back")
        self.assertEqual({t["name"]: t["checksum"] for t in self.client.info("back")},
                         {t["name"]: t["checksum"] for t in self.client.info("m")})
        sharded = os.path.join(self.tmp.name, "sharded")
        r = self.client.persist("m", sharded, max_shard_size="4KiB")
        self.assertEqual(r["files"][-1], "model.safetensors.index.json")
        self.assertEqual(r["files"][0], "model-00001-of-%05d.safetensors" % (len(r["files"]) - 1))
        index = json.loads(read(os.path.join(sharded, "model.safetensors.index.json")))
        self.assertEqual(set(index["weight_map"]), set(self.sd))
        self.client.load(sharded, "back2")
        back = self.client.attach("back2")
        for k, t in self.sd.items():
            self.assertTrue(torch.equal(back.tensor(k), t), k)
        del back

    def test_publish_with_persist_dir_writes_the_published_generation(self):
        out = os.path.join(self.tmp.name, "published")
        sd = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(2, dtype=torch.bfloat16)}
        summary = self.client.publish("pub", sd, side_files={"config.json": b'{"model_type": "x"}'},
                                      persist_dir=out, persist_max_shard_size="5GB")
        self.assertEqual(sorted(os.listdir(out)), ["config.json", "model.safetensors"])
        md, tensors = read_safetensors(os.path.join(out, "model.safetensors"))
        for k, t in sd.items():
            self.assertEqual(tensors[k][2], t.view(torch.uint8).numpy().tobytes(), k)
        self.assertEqual(read(os.path.join(out, "config.json")), b'{"model_type": "x"}')
        # A persist pinned to a generation that was replaced meanwhile is refused.
        self.client.publish("pub", sd, replace=True)
        with self.assertRaises(ckpt.FailedPrecondition):
            self.client.persist("pub", out, replace=True, generation=int(summary["generation"]))

    def test_side_file_names_persist_cannot_write_are_refused_at_publish(self):
        # Before: publish took these and persist then wrote an index of its own, fake
        # shards and names with escape or newline bytes beside the tensors.
        sd = {"a": torch.ones(3)}
        for name in ("model.safetensors.index.json", "model-00001-of-00009.safetensors", "pytorch_model.bin",
                     "evil\n.json", "\x1b]0;title\x07.json", "-rf", ".env", "sub/dir.json"):
            with self.subTest(name=name):
                with self.assertRaises(ckpt.InvalidArgument) as cm:
                    self.client.publish("sides", sd, side_files={name: b"{}"})
                self.assertIn("side file name", str(cm.exception))
                self.assertNotIn("sides", [s["name"] for s in self.client.list()])
        self.client.publish("sides", sd, side_files={"tokenizer.model": b"x", "special_tokens_map.json": b"{}"})
        out = os.path.join(self.tmp.name, "sides-out")
        self.client.persist("sides", out)
        self.assertEqual(sorted(os.listdir(out)), ["model.safetensors", "special_tokens_map.json", "tokenizer.model"])

    def test_an_exception_from_progress_cancels_and_leaves_the_old_folder(self):
        out = os.path.join(self.tmp.name, "out")
        self.client.persist("m", out)
        before = read(os.path.join(out, "model.safetensors"))

        def boom(done, total):
            raise KeyboardInterrupt()

        with self.assertRaises(KeyboardInterrupt):
            self.client.persist("m", out, replace=True, progress=boom)
        self.assertFalse([n for n in os.listdir(self.tmp.name) if ".persist-" in n])
        self.assertEqual(read(os.path.join(out, "model.safetensors")), before)
        with self.assertRaises(ckpt.AlreadyExists):
            self.client.persist("m", out)
        with self.assertRaises(ckpt.NotFound):
            self.client.persist("absent", os.path.join(self.tmp.name, "x"))
        with self.assertRaises(ckpt.InvalidArgument):
            self.client.persist("m", os.path.join(self.tmp.name, "x"), max_shard_size="5XB")
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "x")))
        self.client.persist("m", out, replace=True)  # and the client still serves


if __name__ == "__main__":
    unittest.main()
