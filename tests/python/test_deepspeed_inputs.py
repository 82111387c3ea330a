"""ckpt.deepspeed's bad-input paths that need no DeepSpeed, against the real daemon (Debian's
torch 1.13): a DeepSpeed version it does not know, DeepSpeed missing, a model whose
parameters are not in the checkpoint (named), a parameter that is no ZeRO-3 parameter, and
a MiCS shard group that does not divide the world. test_deepspeed.py runs the same paths
on real ZeRO-3 / MiCS models where the carried DeepSpeed source is there."""
import importlib.util
import os
import sys
import tempfile
import unittest

import torch
from torch import nn

import ckpt
import ckpt.deepspeed as ckds

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ckpt import Daemon, make_checkpoint  # noqa: E402


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 2, bias=False)


class DeepSpeedInputsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        sd = {k: v.detach().clone() for k, v in Two().state_dict().items()}
        path = os.path.join(cls.tmp.name, "two.safetensors")
        make_checkpoint.write_safetensors(path, sd)
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.client.load(path, name="two")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_versions(self):
        for good in ("0.14.5", "0.14.0", "0.14.5+eb07d41f9", "0.14"):
            self.assertEqual(ckds.check_version(good), good)
        for bad in ("0.16.2", "0.15.0", "0.13.9", "1.14.5", "unknown", ""):
            with self.assertRaises(ckpt.Unsupported) as e:
                ckds.check_version(bad)
            self.assertIn(f"DeepSpeed {bad} is not a version ckpt.deepspeed knows", str(e.exception))
            self.assertIn("0.14.x", str(e.exception))

    @unittest.skipIf(importlib.util.find_spec("deepspeed") is not None, "DeepSpeed is importable here")
    def test_without_deepspeed(self):
        for call in (lambda: ckds.init_inference("two"), lambda: ckds.zero3_model("two", {}),
                     lambda: ckds.zero3_init({}).__enter__(), lambda: ckds.gathers_waited().__enter__()):
            with self.assertRaises(ckpt.Unsupported) as e:
                call()
            self.assertIn("needs DeepSpeed", str(e.exception))
            self.assertIn("tools/deepspeed-src/obtain.sh", str(e.exception))

    def test_parameter_not_in_checkpoint(self):
        model = Two()
        model.c = nn.Linear(2, 3)
        with self.assertRaises(ckpt.InvalidArgument) as e:
            ckds.fill_zero3(model, self.client.attach("two"), rank=0, world=1)
        msg = str(e.exception)
        self.assertIn("two: 2 parameters the checkpoint lacks: c.bias, c.weight", msg)

    def test_checkpoint_tensor_nothing_takes(self):
        model = Two()
        del model.b
        with self.assertRaises(ckpt.InvalidArgument) as e:
            ckds.fill_zero3(model, self.client.attach("two"), rank=0, world=1)
        self.assertIn("checkpoint tensors no parameter or buffer takes: b.weight", str(e.exception))

    def test_not_a_zero3_parameter(self):
        model = Two()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with self.assertRaises(ckpt.InvalidArgument) as e:
            ckds.fill_zero3(model, self.client.attach("two"), rank=0, world=1)
        self.assertIn("parameter a.weight is not a ZeRO-3 parameter", str(e.exception))
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p, before[n]), n)

    def test_layout_arguments(self):
        ck = self.client.attach("two")
        with self.assertRaises(ckpt.InvalidArgument) as e:
            ckds.fill_zero3(Two(), ck, rank=1, world=3, group_size=2)
        self.assertIn("MiCS shard group size 2 must divide world 3", str(e.exception))
        with self.assertRaises(ckpt.InvalidArgument) as e:
            ckds.fill_zero3(Two(), ck, rank=4, world=4)
        self.assertIn("rank 4 out of range for world 4", str(e.exception))


if __name__ == "__main__":
    unittest.main()
