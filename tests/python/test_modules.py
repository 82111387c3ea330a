"""ckpt.fill_module and ckpt.launcher_env against the real ckptd, on checkpoints written by
PyTorch from a hand-made nn.Module. Run by ctest with Debian's torch 1.13 (no
load_state_dict(assign=True) there): tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR
and PYTHONPATH."""
import gc
import os
import sys
import tempfile
import unittest
from unittest import mock

import torch
from torch import nn

import ckpt
from ckpt.meta import parameters_on_meta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ckpt  # noqa: E402  (its Daemon and make_checkpoint; not its test class)

make_checkpoint = test_ckpt.make_checkpoint

H, V, F = 32, 48, 64  # hidden, vocabulary, MLP width: all divisible by 2 and 4


class Block(nn.Module):
    def __init__(self, h, f, world=1):
        super().__init__()
        # world > 1: Megatron-style local shapes (q/k/v and up column-parallel, o and down row-parallel)
        self.q = nn.Linear(h, h // world)
        self.k = nn.Linear(h, h // world)
        self.v = nn.Linear(h, h // world)
        self.o = nn.Linear(h // world, h, bias=False)
        self.up = nn.Linear(h, f // world)
        self.down = nn.Linear(f // world, h, bias=False)
        self.norm = nn.LayerNorm(h)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, h, 2).float() / h)), persistent=False)

    def forward(self, x):
        y = self.norm(x)
        a = torch.softmax(self.q(y) @ self.k(y).transpose(-1, -2), -1) @ self.v(y)
        x = x + self.o(a)
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, layers=2, h=H, world=1):
        super().__init__()
        self.embed = nn.Embedding(V, h)
        self.blocks = nn.ModuleList([Block(h, F, world) for _ in range(layers)])
        self.lm_head = nn.Linear(h, V, bias=False)
        self.lm_head.weight = self.embed.weight  # tied, as tie_weights() leaves them
        self.register_buffer("scale", torch.ones(h))  # persistent: in the checkpoint

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(x * self.scale)


PLAN = {r"\.(q|k|v|up)\.(weight|bias)$": ckpt.column(), r"\.(o|down)\.weight$": ckpt.row()}


def reference_slice(name, t, rank, world):
    if any(name.endswith(f".{p}.{w}") for p in ("q", "k", "v", "up") for w in ("weight", "bias")):
        return torch.chunk(t, world, 0)[rank]
    if name.endswith(".o.weight") or name.endswith(".down.weight"):
        return torch.chunk(t, world, -1)[rank]
    return t


def on_meta(**kwargs):
    with parameters_on_meta():
        return Tiny(**kwargs)


def all_meta(model):
    return all(p.is_meta for p in model.parameters())


class FillModuleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        torch.manual_seed(7)
        cls.ref = Tiny().eval()
        with torch.no_grad():
            cls.ref.scale.mul_(torch.rand(H) + 0.5)
        sd = cls.ref.state_dict()
        del sd["lm_head.weight"]  # a tied weight is stored once (save_pretrained does the same)
        cls.sd = {k: v.clone() for k, v in sd.items()}
        cls.daemon = test_ckpt.Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.load("tiny", cls.sd)
        cls.ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))

    @classmethod
    def load(cls, name, tensors):
        path = os.path.join(cls.tmp.name, f"{name}.safetensors")
        make_checkpoint.write_safetensors(path, tensors)
        cls.client.load(path, name)
        return cls.client.attach(name)

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        gc.collect()
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_world_1_fills_a_meta_model_that_runs_like_the_original(self):
        model = on_meta()
        self.assertTrue(all_meta(model))
        report = ckpt.fill_module(model, self.client.attach("tiny"), 0, 1)
        self.assertFalse(all_meta(model))
        self.assertFalse(any(p.is_meta for p in model.parameters()))
        for name, t in self.ref.state_dict().items():
            self.assertTrue(torch.equal(model.state_dict()[name], t), name)
        self.assertIs(model.lm_head.weight, model.embed.weight, "tied parameters stay one Parameter")
        self.assertEqual(report.tied, [("embed.weight", "lm_head.weight")])
        self.assertIn("lm_head.weight", report.loaded)
        self.assertEqual(report.buffers, ["scale"])
        self.assertEqual((report.missing, report.unexpected), ([], []))
        with torch.no_grad():
            self.assertTrue(torch.equal(model.eval()(self.ids), self.ref(self.ids)))
        self.assertTrue(model.blocks[0].q.weight.requires_grad)

    def test_cpu_parameters_are_private_copies_by_default(self):
        # By default parameters own their memory (a view would copy pages on the first in-place update).
        c = self.client.attach("tiny")
        model = on_meta()
        ckpt.fill_module(model, c, 0, 1)
        view = c.tensor("blocks.0.q.weight")
        lo, hi = view.data_ptr(), view.data_ptr() + view.numel() * view.element_size()
        p = model.blocks[0].q.weight
        self.assertFalse(lo <= p.data_ptr() < hi, "copy=True is the CPU default")
        with torch.no_grad():
            p.add_(1.0)  # writable
        shared = on_meta()
        ckpt.fill_module(shared, c, 0, 1, copy=False)
        self.assertEqual(shared.blocks[0].q.weight.data_ptr(), view.data_ptr(), "copy=False: zero copy")

    def test_world_2_megatron_style_modules_take_their_slices(self):
        c = self.client.attach("tiny")
        for world in (2, 4):
            for rank in range(world):
                model = on_meta(world=world)
                ckpt.fill_module(model, c, rank, world, PLAN)
                got = model.state_dict()
                for name, t in self.ref.state_dict().items():
                    self.assertTrue(torch.equal(got[name], reference_slice(name, t, rank, world)),
                                    f"{name} rank {rank}/{world}")
                self.assertIs(model.lm_head.weight, model.embed.weight)

    def test_global_shapes_for_modules_that_keep_unsharded_shapes(self):
        # transformers' tensor-parallel models: the module has full shapes, ranks get slices.
        c = self.client.attach("tiny")
        model = on_meta()
        ckpt.fill_module(model, c, 1, 2, PLAN, shapes="global")
        self.assertEqual(tuple(model.blocks[1].q.weight.shape), (H // 2, H))
        self.assertTrue(torch.equal(model.blocks[1].o.weight, torch.chunk(self.sd["blocks.1.o.weight"], 2, -1)[1]))
        # The same shards into a module that expects them whole: a shape error, untouched.
        model = on_meta()
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"shape does not fit: blocks\.0\.q\.weight \(16, 32\) "
                                                          r"\(module \(32, 32\)\)"):
            ckpt.fill_module(model, c, 1, 2, PLAN)
        self.assertTrue(all_meta(model))

    def test_global_shapes_take_uneven_vocabulary_parts(self):
        c = self.client.attach("tiny")
        plan = {r"^embed\.weight$": ckpt.column(0, allow_uneven=True)}
        for rank in range(5):  # 48 rows over 5 ranks: 10, 10, 10, 9, 9
            model = on_meta()
            ckpt.fill_module(model, c, rank, 5, plan, shapes="global")
            want = torch.tensor_split(self.sd["embed.weight"], 5)[rank]
            self.assertTrue(torch.equal(model.embed.weight, want), rank)
            self.assertIs(model.lm_head.weight, model.embed.weight)

    def test_missing_tensor_is_an_error_naming_it_and_the_module_is_untouched(self):
        tensors = dict(self.sd)
        del tensors["blocks.1.up.bias"]
        c = self.load("tiny-missing", tensors)
        model = on_meta()
        with self.assertRaises(ckpt.InvalidArgument) as cm:
            ckpt.fill_module(model, c, 0, 1)
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIn("1 missing (no tensor in the checkpoint): blocks.1.up.bias", str(cm.exception))
        self.assertIn("checkpoint 'tiny-missing'", str(cm.exception))
        self.assertIn("unchanged", str(cm.exception))
        self.assertTrue(all_meta(model), "nothing filled on error")
        self.assertTrue(model.scale.device.type == "cpu" and torch.equal(model.scale, torch.ones(H)))
        # strict=False does not leave a parameter on meta silently: an error names it and
        # the module is unchanged (issue 13: torch 1.13's load_state_dict did exactly that).
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"1 left on the meta device .*: blocks\.1\.up\.bias"):
            ckpt.fill_module(model, c, 0, 1, strict=False)
        self.assertTrue(all_meta(model), "nothing filled on error")
        # allow_meta=True fills the rest and reports the hole.
        report = ckpt.fill_module(model, c, 0, 1, strict=False, allow_meta=True)
        self.assertEqual(report.missing, ["blocks.1.up.bias"])
        self.assertTrue(model.blocks[1].up.bias.is_meta)
        self.assertFalse(model.blocks[1].up.weight.is_meta)

    def test_unexpected_tensor_is_an_error_naming_it(self):
        model = on_meta(layers=1)  # the checkpoint has two blocks
        with self.assertRaises(ckpt.InvalidArgument) as cm:
            ckpt.fill_module(model, self.client.attach("tiny"), 0, 1)
        msg = str(cm.exception)
        self.assertIn("unexpected (no such parameter or buffer): blocks.1.", msg)
        self.assertIn("and 4 more", msg)  # 12 names of block 1, 8 shown
        self.assertTrue(all_meta(model))
        report = ckpt.fill_module(model, self.client.attach("tiny"), 0, 1, strict=False)
        self.assertEqual(len(report.unexpected), 12)
        self.assertTrue(all(n.startswith("blocks.1.") for n in report.unexpected))
        model = on_meta(layers=1)
        report = ckpt.fill_module(model, self.client.attach("tiny"), 0, 1, ignore=[r"^blocks\.1\."])
        self.assertEqual(len(report.ignored), 12)

    def test_tied_names_with_different_tensors_are_an_error(self):
        tensors = dict(self.sd)
        tensors["lm_head.weight"] = torch.randn(V, H)
        c = self.load("tiny-untied", tensors)
        model = on_meta()
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"tied parameters with different tensors in the "
                                                          r"checkpoint: lm_head\.weight != embed\.weight"):
            ckpt.fill_module(model, c, 0, 1, strict=False)
        self.assertTrue(all_meta(model))
        tensors["lm_head.weight"] = self.sd["embed.weight"].clone()  # equal copies are fine
        c = self.load("tiny-tied-twice", tensors)
        ckpt.fill_module(model, c, 0, 1)
        self.assertIs(model.lm_head.weight, model.embed.weight)

    def test_buffers_non_persistent_ones_are_the_modules_own(self):
        tensors = dict(self.sd)
        tensors["blocks.0.inv_freq"] = torch.zeros(H // 2)  # a stale copy of a computed buffer
        c = self.load("tiny-buffers", tensors)
        model = on_meta()
        report = ckpt.fill_module(model, c, 0, 1)
        self.assertEqual(report.ignored, ["blocks.0.inv_freq"])
        self.assertTrue(torch.equal(model.blocks[0].inv_freq, self.ref.blocks[0].inv_freq))
        self.assertTrue(torch.equal(model.scale, self.ref.scale))
        # A buffer that was built on the meta device has no values: reported missing.
        model = on_meta()
        model.blocks[1]._buffers["inv_freq"] = torch.empty(H // 2, device="meta")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"blocks\.1\.inv_freq \(buffer on the meta device\)"):
            ckpt.fill_module(model, self.client.attach("tiny"), 0, 1)
        self.assertTrue(all_meta(model))

    def test_plan_that_does_not_divide_leaves_the_module_untouched(self):
        model = on_meta()
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot split|divide"):
            ckpt.fill_module(model, self.client.attach("tiny"), 0, 3, PLAN, shapes="global")
        self.assertTrue(all_meta(model))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "shapes must be"):
            ckpt.fill_module(model, self.client.attach("tiny"), 0, 1, shapes="bogus")

    def test_a_mapping_of_shards_works_like_a_checkpoint(self):
        c = self.client.attach("tiny")
        shards = c.state_dict(1, 2, PLAN, copy=True)
        model = on_meta(world=2)
        ckpt.fill_module(model, shards, 1, 2)
        self.assertTrue(torch.equal(model.blocks[0].up.bias, torch.chunk(self.sd["blocks.0.up.bias"], 2)[1]))

    def test_make_parameter_wraps_each_shard(self):
        seen = []

        def wrap(name, t, old):
            seen.append((name, tuple(old.shape)))
            return t * 2 if name == "blocks.0.q.bias" else t

        model = on_meta()
        ckpt.fill_module(model, self.client.attach("tiny"), 0, 1, make_parameter=wrap)
        self.assertIn(("embed.weight", (V, H)), seen)
        self.assertNotIn("lm_head.weight", [n for n, _ in seen], "once per tied group")
        self.assertTrue(torch.equal(model.blocks[0].q.bias, self.sd["blocks.0.q.bias"] * 2))

    def test_a_failing_make_parameter_leaves_the_module_untouched(self):
        def wrap(name, t, old):
            if name == "blocks.1.down.weight":  # late in the module: earlier ones already made
                raise RuntimeError("cannot wrap")
            return t

        model = on_meta()
        with self.assertRaisesRegex(RuntimeError, "cannot wrap"):
            ckpt.fill_module(model, self.client.attach("tiny"), 0, 1, make_parameter=wrap)
        self.assertTrue(all_meta(model))

    def test_rank_and_world_default_from_the_launcher(self):
        c = self.client.attach("tiny")
        with mock.patch.dict(os.environ, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}):
            model = on_meta(world=2)
            ckpt.fill_module(model, c, plan=PLAN)
        self.assertTrue(torch.equal(model.blocks[0].q.weight, torch.chunk(self.sd["blocks.0.q.weight"], 2)[1]))
        with mock.patch.dict(os.environ, {"RANK": "2", "WORLD_SIZE": "2"}):
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"):
                ckpt.fill_module(on_meta(world=2), c, plan=PLAN)


class LauncherEnvTest(unittest.TestCase):
    def test_launchers(self):
        L = ckpt.launcher_env
        self.assertEqual(L({}), ckpt.Launch(0, 1, 0, 1, "none"))
        self.assertEqual(L({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),
                         (3, 8, 1, 2, "torchrun"))
        self.assertEqual(L({"RANK": "3", "WORLD_SIZE": "4"}), (3, 4, 3, 4, "torchrun"))  # one node
        self.assertEqual(L({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
                            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}),
                         (5, 6, 1, 2, "open-mpi"))
        self.assertEqual(L({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0"}).source, "pmi")
        self.assertEqual(L({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}), (1, 2, 1, 2, "slurm"))
        self.assertEqual(L({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                            "SLURM_NTASKS_PER_NODE": "4(x2)"}), (5, 8, 1, 4, "slurm"))
        # torchrun wins over an outer mpirun / srun
        self.assertEqual(L({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}).source,
                         "torchrun")
        # a half-set family is skipped
        self.assertEqual(L({"RANK": "1", "PMI_RANK": "1", "PMI_SIZE": "2"}).source, "pmi")

    def test_bad_values_name_the_variable(self):
        L = ckpt.launcher_env
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"WORLD_SIZE='two' is not an integer"):
            L({"RANK": "0", "WORLD_SIZE": "two"})
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"WORLD_SIZE=0 must be at least 1"):
            L({"RANK": "0", "WORLD_SIZE": "0"})
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"OMPI_COMM_WORLD_RANK=-1 is outside"):
            L({"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"})
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"LOCAL_RANK=4 is outside \[0, LOCAL_WORLD_SIZE=4\)"):
            L({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"})

    def test_explicit_arguments_win(self):
        from ckpt.launcher import resolve_rank_world
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
        self.assertEqual(resolve_rank_world(None, None, env), (1, 2, 1, 2, "torchrun"))
        self.assertEqual(resolve_rank_world(0, 4, env), (0, 4, 0, 4, "arguments"))
        self.assertEqual(resolve_rank_world(None, 4, env).rank, 1)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"rank 3 out of range for world 2 \(launcher: torchrun\)"):
            resolve_rank_world(3, None, env)


if __name__ == "__main__":
    unittest.main()
