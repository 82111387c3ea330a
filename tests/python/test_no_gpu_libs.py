"""The Python module on a machine with no CUDA runtime, NVIDIA driver or NCCL (issue 13).

Run by ctest under tests/support/without_gpu_libs.sh, which hides every libcudart,
libcuda and libnccl file in a private mount namespace: `import ckpt` and every CPU path
must work, and the GPU calls must fail with an error naming what is missing."""
import ctypes
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except (ImportError, OSError) as e:  # a CUDA build of torch needs the hidden libraries itself
    raise unittest.SkipTest(f"this torch cannot load without the CUDA libraries: {e}")

import ckpt

from test_ckpt import Daemon, ds_partition, make_checkpoint  # noqa: E402  (the same daemon helper)

GPU_LIBS = ("libcudart.so.13", "libcudart.so", "libcuda.so.1", "libnccl.so.2")
PLUGIN = os.path.join(os.path.dirname(ckpt._ckpt.__file__), "libckptclient-cuda.so.0")


def loaded_gpu_libraries():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if any(n in line for n in ("libcudart", "libcuda.", "libnccl"))})


@unittest.skipUnless(os.environ.get("CKPT_NO_GPU_LIBS"), "needs tests/support/without_gpu_libs.sh")
class NoGpuLibrariesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.sd = make_checkpoint.gpt_state_dict(mib=2, layers=2, seed=5)
        cls.path = os.path.join(cls.tmp.name, "gpt.safetensors")
        make_checkpoint.write_safetensors(cls.path, cls.sd)
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.client.load(cls.path, name="gpt")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_the_gpu_libraries_really_cannot_be_loaded(self):
        for name in GPU_LIBS:
            with self.assertRaises(OSError, msg=f"{name} loaded: the test would prove nothing"):
                ctypes.CDLL(name)

    def test_cpu_paths_work_and_load_no_gpu_library(self):
        c = self.client.attach("gpt")
        for name, ref in self.sd.items():
            self.assertTrue(torch.equal(c.tensor(name), ref), name)
        w = self.sd["h.0.mlp.c_fc.weight"]
        self.assertTrue(torch.equal(c.shard("h.0.mlp.c_fc.weight", ckpt.column(), 1, 2), torch.chunk(w, 2, 0)[1]))
        parts = c.partitions(1, 3)
        for name, ref in self.sd.items():
            self.assertTrue(torch.equal(parts[name], ds_partition(ref, 1, 3)), name)
        sd = self.client.state_dict("gpt", 0, 2, {r"c_fc\.weight$": ckpt.column()})
        self.assertTrue(torch.equal(sd["h.1.mlp.c_fc.weight"], torch.chunk(self.sd["h.1.mlp.c_fc.weight"], 2, 0)[0]))
        outs = c.resolve(0, 2, {r"c_fc\.weight$": ckpt.column()})
        self.assertEqual(len(outs), len(self.sd))
        self.assertFalse(ckpt._ckpt.gpu_available())
        self.assertEqual(loaded_gpu_libraries(), [])

    def test_gpu_load_names_what_is_missing(self):
        c = self.client.attach("gpt")
        with self.assertRaises(ckpt.CkptError) as e:
            c.state_dict(device="cuda:0", engine="gpu")
        if os.path.exists(PLUGIN):  # a build with CUDA: the plugin loads, the driver is missing
            self.assertIn("libcuda.so.1 (the NVIDIA driver) could not be loaded", str(e.exception))
        else:
            self.assertIn("built without CUDA", str(e.exception))
        # ... and nothing else changed: CPU paths still serve.
        self.assertTrue(torch.equal(c.tensor("wte.weight"), self.sd["wte.weight"]))
        self.assertEqual(loaded_gpu_libraries(), [])

    @unittest.skipUnless(os.path.exists(PLUGIN), "built without CUDA")
    def test_collective_calls_name_nccl(self):
        with self.assertRaises(ckpt.CkptError) as e:
            ckpt._ckpt.NcclGroup.unique_id()
        self.assertIn("libnccl.so.2 not found", str(e.exception))
        self.assertIn("file too short", str(e.exception))

    @unittest.skipUnless(os.path.exists(PLUGIN), "built without CUDA")
    def test_plugin_override_to_a_missing_path(self):
        code = ("import ckpt\nc = ckpt.connect(%r)\n"
                "try:\n    c.attach('gpt').state_dict(device='cuda:0', engine='gpu')\n"
                "except ckpt.CkptError as e:\n    print('ERR', e)\n"
                "print('CPU', c.attach('gpt').tensor('wte.weight').shape)\n") % self.daemon.socket
        env = dict(os.environ, CKPT_GPU_PLUGIN="/nonexistent/libckptclient-cuda.so.0")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ERR CKPT_GPU_PLUGIN=/nonexistent/libckptclient-cuda.so.0: no such file", r.stdout)
        self.assertIn("CPU torch.Size", r.stdout)


    def run_child(self, code, **env):
        r = subprocess.run([sys.executable, "-c", "import ckpt\n" + code], env=dict(os.environ, **env),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    @unittest.skipUnless(os.path.exists(PLUGIN), "built without CUDA")
    def test_a_library_that_is_not_the_plugin_is_refused(self):
        out = self.run_child("print(ckpt._ckpt.gpu_available())\n"
                             "try:\n    ckpt._ckpt.NcclGroup.unique_id()\n"
                             "except ckpt.CkptError as e:\n    print('ERR', e)\n",
                             CKPT_GPU_PLUGIN=ckpt._ckpt.__file__)
        self.assertIn("False", out)
        self.assertIn("has no ckpt_gpu_plugin_entry: not a ckpt GPU plugin", out)

    @unittest.skipUnless(os.path.exists(PLUGIN), "built without CUDA")
    def test_a_library_that_is_not_nccl_is_refused(self):
        libz = next(p for p in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1",
                                "/lib64/libz.so.1") if os.path.exists(p))
        out = self.run_child("try:\n    ckpt._ckpt.NcclGroup.unique_id()\n"
                             "except ckpt.CkptError as e:\n    print('ERR', type(e).__name__, e)\n",
                             CKPT_NCCL_LIBRARY=libz)
        self.assertIn(f"ERR Unsupported CKPT_NCCL_LIBRARY={libz}", out)
        self.assertIn("is NCCL unknown, lacking ncclGetVersion", out)
        self.assertIn("collective loads need NCCL 2 >= 2.14", out)


if __name__ == "__main__":
    unittest.main()
