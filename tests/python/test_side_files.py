"""Side files through the Python module: Checkpoint.config, .metadata, .side_file(name) and
.side_files read from the attachment, byte for byte, after the folder is gone."""
import os
import shutil
import tempfile
import unittest

import torch

import ckpt
from test_ckpt import Daemon, make_checkpoint


def write_safetensors(path, metadata):
    """One U8 tensor "w" = b"wxyz" and `metadata`."""
    make_checkpoint.write_safetensors(path, {"w": torch.frombuffer(bytearray(b"wxyz"), dtype=torch.uint8)}, metadata)


class SideFilesTest(unittest.TestCase):
    def test_config_metadata_and_side_files_round_trip(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "model")
            os.mkdir(folder)
            write_safetensors(os.path.join(folder, "model.safetensors"), {"format": "pt", "note": "caf\u00e9"})
            config = ('{"model_type": "llama", "architectures": ["LlamaForCausalLM"], '
                      '"hidden_size": 64, "name": "\u00e9t\u00e9"}\n').encode("utf-8")
            with open(os.path.join(folder, "config.json"), "wb") as f:
                f.write(config)
            with open(os.path.join(folder, "generation_config.json"), "wb") as f:
                f.write(b'{"do_sample": true}')
            with open(os.path.join(tmp, "outside.json"), "wb") as f:
                f.write(b'{"secret": 1}')
            os.symlink(os.path.join(tmp, "outside.json"), os.path.join(folder, "tokenizer_config.json"))
            daemon = Daemon(tmp)
            daemon.start()
            try:
                client = ckpt.connect(daemon.socket)
                client.load(folder, "m")
                shutil.rmtree(folder)  # clients read the attachment, never the files
                c = client.attach("m")
                self.assertEqual(c.side_files, ["config.json", "generation_config.json"])
                self.assertEqual(c.side_file("config.json"), config)
                self.assertEqual(c.config["model_type"], "llama")
                self.assertEqual(c.config["name"], "\u00e9t\u00e9")
                self.assertEqual(c.metadata, {"format": "pt", "note": "caf\u00e9"})
                with self.assertRaises(ckpt.NotFound):
                    c.side_file("tokenizer_config.json")
                # A checkpoint without a folder's side files: config is None.
                lone = os.path.join(tmp, "lone")
                os.mkdir(lone)
                write_safetensors(os.path.join(lone, "x.safetensors"), {})
                client.load(os.path.join(lone, "x.safetensors"), "x")
                x = client.attach("x")
                self.assertIsNone(x.config)
                self.assertEqual(x.metadata, {})
                self.assertEqual(x.side_files, [])
                del c, x
            finally:
                client = None
                daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
