"""The tools' scripts run by their shebang (`#!/usr/bin/env python3`) work whatever python3
comes first on PATH: one without torch re-runs them under a Python that has it
(tools/torch_python.py). Issue 13."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.environ["CKPT_TOOLS_DIR"]


class ToolShebangTest(unittest.TestCase):
    def test_make_checkpoint_runs_under_a_python_without_torch_on_path(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "bare")  # no system site-packages: no torch
            subprocess.check_call([sys.executable, "-m", "venv", "--without-pip", venv])
            bare = os.path.join(venv, "bin", "python3")
            r = subprocess.run([bare, "-c", "import torch"], capture_output=True)
            self.assertNotEqual(r.returncode, 0, "the bare venv has torch: the test would prove nothing")
            env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"],
                       CKPT_TORCH_PYTHON=sys.executable)
            out = os.path.join(tmp, "m.safetensors")
            r = subprocess.run([os.path.join(TOOLS, "make_checkpoint.py"), out, "--mib", "0.5"], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.getsize(out) > 0)

    def test_no_python_with_torch_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "bare")
            subprocess.check_call([sys.executable, "-m", "venv", "--without-pip", venv])
            bare = os.path.join(venv, "bin", "python3")
            # Already re-run once: no further interpreter is tried.
            env = dict(os.environ, CKPT_TORCH_REEXEC="1")
            r = subprocess.run([bare, os.path.join(TOOLS, "make_checkpoint.py"), os.path.join(tmp, "x")], env=env,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("make_checkpoint.py needs PyTorch", r.stderr)


if __name__ == "__main__":
    unittest.main()
