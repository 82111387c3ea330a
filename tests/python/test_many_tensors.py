"""100 000 small tensors through every per-tensor step (issue 23): the file's header parse,
the load plan, the segment layout, the catalog, attach, keys, state_dict, info, verify, and
the write path (publish) of the same tensors. Not timed here (tools/bench_many_tensors.py
measures it, docs/benchmarks.md); the test keeps it working and fails by its timeout if a
step turns quadratic again (88 s for the load alone before the fix)."""
import os
import sys
import tempfile
import unittest

import torch

import ckpt
from test_ckpt import Daemon

sys.path.insert(0, os.environ["CKPT_TOOLS_DIR"])
from bench_many_tensors import write_many  # noqa: E402

COUNT = 100000


class ManyTensorsTest(unittest.TestCase):
    def test_a_100000_tensor_checkpoint_loads_attaches_and_publishes(self):
        with tempfile.TemporaryDirectory() as tmp:
            daemon = Daemon(tmp)
            daemon.start()
            try:
                client = ckpt.connect(daemon.socket)
                path = os.path.join(tmp, "many.safetensors")
                write_many(path, COUNT)
                client.load(path, "many")
                c = client.attach("many")
                names = c.keys()
                self.assertEqual(len(names), COUNT)
                self.assertEqual(len(client.info("many")), COUNT)
                sd = c.state_dict()
                self.assertEqual(len(sd), COUNT)
                self.assertTrue(torch.equal(sd["t.99999"], torch.ones(4)))
                c.verify()
                tensors = {k: v.clone() for k, v in sd.items()}
                del sd, c
                client.publish("many-pub", tensors)
                p = client.attach("many-pub")
                self.assertEqual(len(p.keys()), COUNT)
                self.assertTrue(torch.equal(p.tensor("t.12345"), torch.ones(4)))
            finally:
                daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
