"""ckpt.serving_cache against the real daemon: a rank's processed tensors are built once,
published, and attached on the next call; another layout, dtype, user key, source
generation or source content misses; N processes racing for one entry all get it, one
entry is left; evict_stale removes entries whose source changed or went away."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import ckpt
import ckpt.serving_cache as sc
from test_ckpt import Daemon


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def source(seed):
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(8, 4, generator=g), "k": torch.randn(8, 4, generator=g), "v": torch.randn(8, 4, generator=g)}


def build_fused(src, rank, world):
    """A 'processed' tensor: fused QKV, this rank's rows, scaled (what a server would compute)."""
    qkv = torch.cat([src.tensor(n) for n in ("q", "k", "v")], 0)
    return {"qkv": qkv.chunk(world, 0)[rank].clone() * 2}


class ServingCacheTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.daemon.start()
        self.client = ckpt.connect(self.daemon.socket)
        self.path = os.path.join(self.tmp.name, "src.safetensors")
        write_safetensors(self.path, source(1))
        self.client.load(self.path, "src")

    def tearDown(self):
        self.client = None
        self.daemon.cleanup()
        self.tmp.cleanup()

    def test_build_once_then_attach_and_every_dependency_changes_the_name(self):
        calls = []

        def build(src, rank, world):
            calls.append((rank, world))
            return build_fused(src, rank, world)

        e = sc.get_or_build(self.client, "src", build, rank=1, world=2, layout={"tp": 2}, dtype="F32")
        self.assertFalse(e.hit)
        expected = build_fused(self.client.attach("src"), 1, 2)["qkv"]
        self.assertTrue(torch.equal(e.tensors["qkv"], expected))
        e2 = sc.get_or_build(self.client, "src", build, rank=1, world=2, layout={"tp": 2}, dtype="F32")
        self.assertTrue(e2.hit)
        self.assertEqual(e2.name, e.name)
        self.assertEqual(calls, [(1, 2)])
        self.assertTrue(torch.equal(e2.tensors["qkv"], expected))
        self.assertEqual(json.loads(e2.checkpoint.side_file(sc.KEY_FILE))["layout"], {"tp": 2})
        names = {e.name}
        for kwargs in ({"rank": 0}, {"layout": {"tp": 4}}, {"dtype": "BF16"}, {"quantization": "fp8"},
                       {"user_key": "other"}, {"versions": {"vllm": "0.9"}}):
            args = dict(rank=1, world=2, layout={"tp": 2}, dtype="F32")
            args.update(kwargs)
            e3 = sc.get_or_build(self.client, "src", build, **args)
            self.assertFalse(e3.hit, kwargs)
            names.add(e3.name)
        self.assertEqual(len(names), 7)
        for n in names:
            self.assertLessEqual(len(n), 100)

    def test_a_new_source_generation_or_content_misses_and_stale_entries_are_evicted(self):
        a = sc.get_or_build(self.client, "src", build_fused)
        loose = sc.get_or_build(self.client, "src", build_fused, match_generation=False)
        # Same content, new generation: the generation-bound entry misses, the loose one hits.
        self.client.load(self.path, "src", replace=True)
        self.assertFalse(sc.get_or_build(self.client, "src", build_fused).hit)
        self.assertTrue(sc.get_or_build(self.client, "src", build_fused, match_generation=False).hit)
        # New content: both miss; the old entries are stale.
        write_safetensors(self.path, source(2))
        self.client.load(self.path, "src", replace=True)
        fresh = sc.get_or_build(self.client, "src", build_fused, match_generation=False)
        self.assertFalse(fresh.hit)
        self.assertNotEqual(fresh.name, loose.name)
        a_name, loose_name = a.name, loose.name
        del a, loose
        evicted = sc.evict_stale(self.client, wait=10)  # a detach reaches the daemon when the lease closes
        self.assertIn(a_name, evicted)
        self.assertIn(loose_name, evicted)
        left = [s["name"] for s in self.client.list()]
        self.assertIn(fresh.name, left)  # current (and attached): kept
        self.assertNotIn(a_name, left)
        # The source gone: its entries are stale too (the attached one only with force).
        self.client.evict("src", wait=10)
        self.assertEqual(sc.evict_stale(self.client), [])
        self.assertIn(fresh.name, sc.evict_stale(self.client, force=True))

    def test_processes_racing_for_one_entry_all_get_it_and_one_entry_is_left(self):
        script = (
            "import sys, torch, ckpt, ckpt.serving_cache as sc\n"
            "sys.path.insert(0, %r)\n"
            "from test_serving_cache import build_fused\n"
            "c = ckpt.connect(sys.argv[1])\n"
            "e = sc.get_or_build(c, 'src', build_fused, rank=0, world=1, user_key='race')\n"
            "print(e.name, e.hit, float(e.tensors['qkv'].sum()))\n") % os.path.dirname(os.path.abspath(__file__))
        procs = [subprocess.Popen([sys.executable, "-c", script, self.daemon.socket], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        lines = [o.split() for o, _ in outs]
        self.assertEqual(len({l[0] for l in lines}), 1)
        self.assertEqual(len({l[2] for l in lines}), 1)
        self.assertEqual(len([s for s in self.client.list() if s["name"] == lines[0][0]]), 1)

    def test_an_entry_another_process_is_still_writing_is_waited_for_and_used(self):
        # Another writer holds the entry's name (its write is under way, nothing published
        # yet): get_or_build waits for that publish and uses it instead of failing.
        import threading
        from ckpt.writer import Writer
        src = self.client.attach("src")
        key = sc.cache_key(src, rank=0, world=1, user_key="slow")
        name = sc.cache_name(key)
        theirs = build_fused(src, 0, 1)
        started = threading.Event()

        class SlowWriter(Writer):
            def _filler(self, t):
                fill = super()._filler(t)

                def slow(offset, ring_offset, size):
                    started.set()
                    time.sleep(1.0)
                    fill(offset, ring_offset, size)
                return slow

        def write():
            w = SlowWriter(self.daemon.socket, name, part=0, parts=1)
            w.add("qkv", theirs["qkv"])
            w.side_file(sc.KEY_FILE, json.dumps(key, sort_keys=True).encode())
            w.commit()
        t = threading.Thread(target=write)
        t.start()
        self.assertTrue(started.wait(10))
        calls = []
        e = sc.get_or_build(self.client, "src", lambda s, r, w: calls.append(1) or build_fused(s, r, w),
                            rank=0, world=1, user_key="slow")
        t.join()
        self.assertEqual(e.name, name)
        self.assertTrue(torch.equal(e.tensors["qkv"], theirs["qkv"]))
        self.assertEqual(len([s for s in self.client.list() if s["name"] == name]), 1)


if __name__ == "__main__":
    unittest.main()
