"""ckpt.deepspeed against DeepSpeed itself, on the CPU: ZeRO-3 (zero.Init) and MiCS
(zero.MiCS_Init) partitions filled from ckptd equal DeepSpeed's own partitions of the same
tensors, at world 1, 2, 3 and 4 (MiCS: shard groups of 2 in a world of 4); AutoTP
(deepspeed.init_inference, tensor_parallel 2, 3, 4) of a model built on the meta device and
filled by ckpt.deepspeed.fill_autotp equals AutoTP's own cut of the real-weight model,
tensor for tensor (uneven 64-element grains, a fused QKV), with equal logits; with
DeepSpeed's CPU accelerator and gloo under Debian's torch 1.13; the bad inputs on real
ZeRO-3 and AutoTP models; transformers' ZeRO-3 loader (GatheredParameters, rank 0 loads)
inside ckpt.deepspeed.gathers_waited against ckptd's fill; and what building under
ckpt.deepspeed.zero3_init costs a rank.

DeepSpeed is not a dependency of ckptd: this runs the source tools/deepspeed-src/obtain.sh puts
in .carry-ds/ (or CKPT_DEEPSPEED_DIR) and exits 77, which ctest reads as skipped, naming
what is missing, when it is not there. Each rank is deepspeed_worker.py."""
import os
import socket as socketlib
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def carried_deepspeed():
    """The folder holding the deepspeed package (and pydantic, hjson), or None with why."""
    where = os.environ.get("CKPT_DEEPSPEED_DIR") or os.path.join(HERE, "..", "..", ".carry-ds")
    where = os.path.abspath(where)
    if not os.path.isfile(os.path.join(where, "deepspeed", "__init__.py")):
        return None, (f"DeepSpeed source not found in {where} (tools/deepspeed-src/obtain.sh puts it there; "
                      "set CKPT_DEEPSPEED_DIR to use another copy)")
    import importlib.util
    lacking = [m for m in ("packaging", "tqdm", "cpuinfo", "psutil", "numpy") if importlib.util.find_spec(m) is None]
    if lacking:  # DeepSpeed's own requirements (Debian: python3-packaging python3-tqdm python3-cpuinfo ...)
        return None, f"DeepSpeed in {where} needs {', '.join(lacking)}, not installed here"
    return where, None


def free_port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeepSpeedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from test_ckpt import Daemon  # (needs CKPTD_BIN, CKPT_TOOLS_DIR)
        cls.ds_dir, _ = carried_deepspeed()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def run_world(self, world, mode, shard=None):
        port = free_port()
        env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   PYTHONPATH=os.pathsep.join([self.ds_dir, os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1", NDEV_PER_NODE=str(world))  # MiCS asks the CPU accelerator via numactl otherwise
        workdir = tempfile.mkdtemp(dir=self.tmp.name)
        procs = []
        for rank in range(world):
            env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            args = [sys.executable, os.path.join(HERE, "deepspeed_worker.py"), self.daemon.socket, workdir, mode]
            if shard:
                args.append(str(shard))
            procs.append(subprocess.Popen(args, env=env_r, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            outs.append((p.returncode, out))
        for rank, (rc, out) in enumerate(outs):
            self.assertEqual(rc, 0, f"rank {rank} of {world} ({mode}):\n{out[-4000:]}")
            self.assertIn(f"RANK {rank} OK", out)

    def test_zero3_world_1_and_2(self):
        self.run_world(1, "zero3")
        self.run_world(2, "zero3")

    def test_zero3_world_3_and_4(self):  # uneven: the last partitions are padded
        self.run_world(3, "zero3")
        self.run_world(4, "zero3")

    def test_mics_shard_groups_of_2_in_4(self):
        self.run_world(4, "mics", shard=2)

    def test_hf_loader_worlds_2_and_4(self):  # transformers' GatheredParameters loader = ckptd's fill
        self.run_world(2, "hfload")
        self.run_world(4, "hfload")

    def test_hf_loader_mics_shard_groups_of_2_in_4(self):
        self.run_world(4, "hfload", shard=2)

    def test_zero3_init_memory_world_2(self):  # building costs a partition, not the whole tensor
        self.run_world(2, "memory")

    def test_autotp_worlds_2_3_4(self):  # inference: a meta model cut by AutoTP, filled from ckptd
        for world in (2, 3, 4):
            self.run_world(world, "autotp")


if __name__ == "__main__":
    ds_dir, why = carried_deepspeed()
    if ds_dir is None:
        print(f"SKIP: {why}")
        sys.exit(SKIP)
    unittest.main(verbosity=2)
