"""Issue 13's Python API gaps against the real ckptd: rank/world from the launcher's
environment (ckpt::LauncherEnv, bound) wherever they are omitted, dtype names as strings,
Client.load(replace=), Client.evict(wait=), and meta parameters that are never left
silently. Run by ctest (tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import os
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch
from torch import nn

import ckpt
import ckpt.launcher
import ckpt.meta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ckpt  # noqa: E402  (its Daemon and make_checkpoint; not its test class)

make_checkpoint = test_ckpt.make_checkpoint
PLAN = {r"\.weight$": ckpt.column()}  # every weight split along dim 0, the rest replicated
TORCHRUN_1_OF_2 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


class LauncherTest(unittest.TestCase):
    """The C++ reader (one source of truth) through ckpt.launcher_env."""

    def test_python_reads_through_the_cpp_function(self):
        self.assertFalse(hasattr(ckpt.launcher, "_FAMILIES"), "no second table of variables in Python")
        with mock.patch.object(ckpt._ckpt, "launcher_env", return_value=(3, 4, 1, 2, "torchrun")) as f:
            self.assertEqual(ckpt.launcher_env({"X": "1"}), (3, 4, 1, 2, "torchrun"))
        f.assert_called_once_with({"X": "1"})

    def test_mvapich_and_slurm_task_lists(self):
        L = ckpt.launcher_env
        self.assertEqual(L({"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4",
                            "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"}),
                         (3, 4, 1, 2, "mvapich2"))
        # srun over 3 nodes, 2 + 2 + 1 tasks: node 2's only task is rank 4.
        self.assertEqual(L({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
                            "SLURM_TASKS_PER_NODE": "2(x2),1"}), (4, 5, 0, 1, "slurm"))
        self.assertEqual(L({"SLURM_PROCID": "1", "SLURM_NTASKS": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                            "SLURM_TASKS_PER_NODE": "2(x2),1"}).local_world, 2)
        # DeepSpeed's launcher spells the local world LOCAL_SIZE.
        self.assertEqual(L({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_SIZE": "4"}),
                         (5, 8, 1, 4, "torchrun"))
        self.assertEqual(L({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}),
                         (2, 4, 0, 2, "pmi"))

    def test_contradictory_and_bad_values_are_errors_naming_them(self):
        L = ckpt.launcher_env
        cases = [
            ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"},
             r"contradictory launcher variables: LOCAL_WORLD_SIZE=8 is more than WORLD_SIZE=4"),
            ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"},
             r"contradictory launcher variables: LOCAL_RANK=2 is more than RANK=1"),
            ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
             r"leaves more ranks after RANK=3 on this node than WORLD_SIZE=4 has"),
            ({"RANK": "99999999999", "WORLD_SIZE": "2"}, r"RANK='99999999999' is not an integer"),
            ({"RANK": "1.0", "WORLD_SIZE": "2"}, r"RANK='1.0' is not an integer"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2(x"},
             r"SLURM_TASKS_PER_NODE='2\(x' is not a Slurm task list"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "5", "SLURM_TASKS_PER_NODE": "1(x2)"},
             r"SLURM_NODEID=5 is past the nodes"),
            ({"MV2_COMM_WORLD_RANK": "4", "MV2_COMM_WORLD_SIZE": "4"},
             r"MV2_COMM_WORLD_RANK=4 is outside \[0, MV2_COMM_WORLD_SIZE=4\)"),
        ]
        for env, message in cases:
            with self.subTest(env=env):
                with self.assertRaisesRegex(ckpt.InvalidArgument, message):
                    L(env)

    def test_an_incomplete_launcher_environment_is_an_error(self):
        """Issue 22: RANK without WORLD_SIZE (and the like) raises, naming what is set and what
        is missing, instead of rank 0 of 1; the C++ rule, so the same cases as launcher_test."""
        L = ckpt.launcher_env
        cases = [
            ({"RANK": "1"}, r"incomplete launcher environment: RANK=1 is set but WORLD_SIZE is not"),
            ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"},
             r"LOCAL_RANK=0 and LOCAL_WORLD_SIZE=8 are set but RANK and WORLD_SIZE are not"),
            ({"RANK": "3", "LOCAL_SIZE": "4"}, r"RANK=3 and LOCAL_SIZE=4 are set but WORLD_SIZE is not"),
            ({"OMPI_COMM_WORLD_RANK": "2"}, r"OMPI_COMM_WORLD_RANK=2 is set but OMPI_COMM_WORLD_SIZE is not"),
            ({"PMI_SIZE": "4"}, r"PMI_SIZE=4 is set but PMI_RANK is not"),
            ({"RANK": "-1", "WORLD_SIZE": "2"}, r"RANK=-1 is outside \[0, WORLD_SIZE=2\)"),
            ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, r"SLURM_PROCID=4 is outside \[0, SLURM_NTASKS=4\)"),
        ]
        for env, message in cases:
            with self.subTest(env=env):
                with self.assertRaisesRegex(ckpt.InvalidArgument, message):
                    L(env)
        # A Slurm batch script (SLURM_PROCID=0, no SLURM_NTASKS) is one process.
        self.assertEqual(L({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"}), (0, 1, 0, 1, "none"))
        # Rank and world given need no launcher.
        self.assertEqual(ckpt.launcher.resolve_rank_world(1, 2, {"RANK": "1"}).rank, 1)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"RANK=1 is set but WORLD_SIZE is not"):
            ckpt.launcher.resolve_rank_world(None, 2, {"RANK": "1"})

    def test_the_process_environment_is_the_default(self):
        with mock.patch.dict(os.environ, {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, clear=True):
            self.assertEqual(ckpt.launcher_env(), (2, 3, 2, 3, "open-mpi"))


class ApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.sd = make_checkpoint.gpt_state_dict(mib=1, layers=1, seed=9)
        cls.path = os.path.join(cls.tmp.name, "gpt.safetensors")
        make_checkpoint.write_safetensors(cls.path, cls.sd)
        cls.daemon = test_ckpt.Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.client.load(cls.path, "gpt")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_rank_and_world_default_from_the_launcher(self):
        c = self.client.attach("gpt")
        want = c.state_dict(1, 2, PLAN)
        weight = next(n for n in self.sd if n.endswith(".weight") and self.sd[n].dim() == 2)
        with mock.patch.dict(os.environ, TORCHRUN_1_OF_2):
            got = c.state_dict(plan=PLAN)
            self.assertEqual(c.shard(weight, ckpt.column()).shape, want[weight].shape)
            parts = c.partitions()
            part = c.partition(weight)
            by_client = self.client.state_dict("gpt", plan=PLAN)
            outputs = c.resolve(plan=PLAN)
        self.assertEqual(sorted(got), sorted(want))
        for name in want:
            self.assertTrue(torch.equal(got[name], want[name]), name)
            self.assertTrue(torch.equal(by_client[name], want[name]), name)
        self.assertEqual(got[weight].shape[0], self.sd[weight].shape[0] // 2, "rank 1 of 2's half, not the whole")
        self.assertTrue(torch.equal(got[weight], torch.chunk(self.sd[weight], 2)[1]))
        self.assertTrue(torch.equal(part, c.partition(weight, 1, 2)))
        self.assertTrue(torch.equal(parts[weight], part))
        self.assertEqual([o.name for o in outputs], [o.name for o in c.resolve(1, 2, PLAN)])
        # Explicit arguments still win; a bad launcher value is an error, not rank 0 of 1.
        with mock.patch.dict(os.environ, TORCHRUN_1_OF_2):
            self.assertTrue(torch.equal(c.state_dict(0, 1)[weight], self.sd[weight]))
        with mock.patch.dict(os.environ, {"RANK": "2", "WORLD_SIZE": "2"}):
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"):
                c.state_dict(plan=PLAN)
        # Without a launcher: rank 0 of 1, every tensor whole.
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertTrue(torch.equal(c.state_dict(plan=PLAN)[weight], self.sd[weight]))

    def test_half_set_launcher_environment_fails_the_load_not_silently_whole(self):
        c = self.client.attach("gpt")
        with mock.patch.dict(os.environ, {"RANK": "1"}):
            os.environ.pop("WORLD_SIZE", None)
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"RANK=1 is set but WORLD_SIZE is not"):
                c.state_dict(plan=PLAN)
            self.assertEqual(sorted(c.state_dict(1, 2, PLAN)), sorted(c.state_dict(0, 2, PLAN)))

    def test_not_found_suggests_the_close_name(self):
        """Issue 22: the same "did you mean" as ckptctl (the C++ client adds it)."""
        for call in (lambda: self.client.attach("gtp"), lambda: self.client.info("gptt"),
                     lambda: self.client.evict("gpt_"), lambda: self.client.state_dict("gp")):
            with self.assertRaises(ckpt.NotFound) as caught:
                call()
            self.assertIn("(did you mean 'gpt'?)", str(caught.exception))
        with self.assertRaises(ckpt.NotFound) as far:
            self.client.attach("zzzzzzzz")
        self.assertNotIn("did you mean", str(far.exception))

    def test_devices_torch_cannot_use_are_clear_errors(self):
        """Issue 22: a CUDA device with a CPU-only torch, an unknown device name, a CUDA index
        past the GPUs: ckpt.InvalidArgument naming the device and what to do, before any
        copy (torch's bare AssertionError before)."""
        c = self.client.attach("gpt")
        name = next(iter(self.sd))
        self.assertIsInstance(ckpt.gpu_available(), bool)
        self.assertEqual(ckpt.as_device("cpu"), torch.device("cpu"))
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"unknown device 'cuda0': use 'cpu', 'cuda' or 'cuda:N'"):
            c.state_dict(device="cuda0")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"device must be a torch.device"):
            ckpt.as_device(1.5)
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            for call in (lambda: c.state_dict(device="cuda:0"), lambda: c.shard(name, device="cuda"),
                         lambda: c.partitions(0, 1, device=torch.device("cuda", 0)),
                         lambda: ckpt.fill_module(nn.Linear(1, 1), c, device="cuda:0")):
                with self.assertRaisesRegex(ckpt.InvalidArgument, r"device 'cuda(:0)?' needs a CUDA build of torch, "
                                            r"but torch .* is CPU-only .*load to device='cpu'"):
                    call()
        # A CUDA build of torch: the count of GPUs it sees decides (this torch's own answers
        # stand in for a GPU machine's; tools/gpu checks the real one).
        with mock.patch.object(torch.version, "cuda", "12.4"), \
                mock.patch.object(torch.cuda, "device_count", return_value=2), \
                mock.patch.object(torch.cuda, "current_device", return_value=1):
            self.assertEqual(ckpt.as_device("cuda"), torch.device("cuda", 1))
            self.assertEqual(ckpt.as_device(0), torch.device("cuda", 0))
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"device 'cuda:5' is out of range: torch sees 2 GPU\(s\), "
                                        r"cuda:0 to cuda:1"):
                c.state_dict(device="cuda:5")
        with mock.patch.object(torch.version, "cuda", "12.4"), \
                mock.patch.object(torch.cuda, "device_count", return_value=0), \
                mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": ""}):
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"sees no GPU \(CUDA_VISIBLE_DEVICES='' hides every GPU\)"):
                c.state_dict(device="cuda:0")

    def test_version_is_the_projects(self):
        self.assertRegex(ckpt.__version__, r"^\d+\.\d+\.\d+$")

    def test_dtype_names(self):
        c = self.client.attach("gpt")
        floats = [n for n in self.sd if self.sd[n].is_floating_point()]
        for name, want in (("float16", torch.float16), ("fp16", torch.float16), ("half", torch.float16),
                           ("F16", torch.float16), ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                           ("BF16", torch.bfloat16), ("torch.float64", torch.float64), ("fp32", torch.float32),
                           (torch.bfloat16, torch.bfloat16)):
            with self.subTest(dtype=name):
                sd = c.state_dict(dtype=name, names=floats[:2])
                self.assertTrue(all(t.dtype == want for t in sd.values()))
                self.assertEqual(c.shard(floats[0], dtype=name).dtype, want)
                self.assertEqual(c.partition(floats[0], 0, 2, dtype=name).dtype, want)
        ref = self.sd[floats[0]]
        self.assertTrue(torch.equal(c.state_dict(dtype="bf16", names=[floats[0]])[floats[0]], ref.to(torch.bfloat16)))
        with self.assertRaises(ckpt.InvalidArgument) as cm:  # was torch's "Invalid device string"
            c.state_dict(dtype="float61")
        self.assertIn("unknown dtype 'float61'", str(cm.exception))
        for valid in ("float16", "bf16", "bfloat16", "fp32"):
            self.assertIn(valid, str(cm.exception))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "dtype must be a torch.dtype or a name"):
            c.shard(floats[0], dtype=16)
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIs(ckpt.as_dtype(None), None)

    def test_load_replace(self):
        first = self.client.load(self.path, "rep")
        with self.assertRaises(ckpt.AlreadyExists):
            self.client.load(self.path, "rep")
        held = self.client.attach("rep")
        second = self.client.load(self.path, "rep", replace=True)
        self.assertGreater(second["generation"], first["generation"])
        self.assertEqual(held.generation, first["generation"], "an attachment keeps its generation")
        self.assertEqual(self.client.attach("rep").generation, second["generation"])
        del held
        self.client.evict("rep", force=True)

    def test_evict_wait(self):
        self.client.load(self.path, "ev")
        held = [self.client.attach("ev")]
        start = time.monotonic()
        with self.assertRaises(ckpt.FailedPrecondition):
            self.client.evict("ev", wait=0.5)
        self.assertGreaterEqual(time.monotonic() - start, 0.45, "it waited")

        def release():
            time.sleep(0.7)
            held.clear()  # the last attachment goes
            import gc
            gc.collect()
        threading.Thread(target=release).start()
        start = time.monotonic()
        evicted = self.client.evict("ev", wait=20)
        self.assertEqual(evicted["name"], "ev")
        self.assertLess(time.monotonic() - start, 15)
        self.assertNotIn("ev", [s["name"] for s in self.client.list()])
        for bad in (-1, float("nan"), 86401):
            with self.assertRaisesRegex(ckpt.InvalidArgument, "evict wait must be 0 to 86400 seconds"):
                self.client.evict("gpt", wait=bad)  # not attached: it would have been evicted
        self.assertIn("gpt", [s["name"] for s in self.client.list()])

    def test_meta_parameters_are_never_left_silently(self):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)
        with ckpt.meta.parameters_on_meta():
            net = Net()
        shards = {"a.weight": torch.ones(4, 4), "a.bias": torch.zeros(4)}
        # torch 1.13 has no load_state_dict(assign=True): without it the meta parameters
        # stay on meta and torch says nothing; check_filled names them.
        net.load_state_dict(shards, strict=False)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"4 tensor\(s\) still on the meta device .*a\.weight"):
            ckpt.meta.check_filled(net)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"left on the meta device .*b\.weight, b\.bias"):
            ckpt.fill_module(net, shards, 0, 1, strict=False)
        self.assertTrue(net.a.weight.is_meta, "unchanged on error")
        report = ckpt.fill_module(net, shards, 0, 1, strict=False, allow_meta=True)
        self.assertEqual(report.missing, ["b.weight", "b.bias"])
        self.assertFalse(net.a.weight.is_meta)
        self.assertEqual(ckpt.meta.meta_tensors(net), ["b.weight", "b.bias"])
        ckpt.fill_module(net, dict(shards, **{"b.weight": torch.ones(4, 4), "b.bias": torch.ones(4)}), 0, 1)
        ckpt.meta.check_filled(net)
        self.assertEqual(ckpt.meta.meta_tensors(net), [])


if __name__ == "__main__":
    unittest.main()
