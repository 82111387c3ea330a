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
import threading
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

    def _hold_entry_unpublished(self, key_json):
        """Starts a publish of the entry's name (with the side file key_json(key)) on a thread
        whose first ring fill waits for `release` (then raises when `fail` is set): the name
        is reserved, nothing is visible. Returns (name, release, fail, thread, errors)."""
        key = sc.cache_key(self.client.attach("src"), rank=0, world=1, user_key="held")
        name = sc.cache_name(key)
        release, fail, filling, errors = threading.Event(), threading.Event(), threading.Event(), []

        class HeldWriter(ckpt.Writer):
            def _filler(self, t):
                fill = super()._filler(t)

                def held(*args):
                    filling.set()
                    release.wait(60)
                    if fail.is_set():
                        raise RuntimeError("the other process's write fails")
                    fill(*args)
                return held

        w = HeldWriter(self.daemon.socket, name)
        w.add("qkv", build_fused(self.client.attach("src"), 0, 1)["qkv"])
        w.side_file(sc.KEY_FILE, key_json(key))

        def commit():
            try:
                w.commit()
            except Exception as e:  # the failing case
                errors.append(e)
        t = threading.Thread(target=commit)
        t.start()
        # The ring is filled only once the daemon reserved the name and made the segment.
        self.assertTrue(filling.wait(30), "the held write never started streaming")
        return name, release, fail, t, errors

    def _get_or_build_on_a_thread(self):
        got = []

        def run():
            try:
                got.append(sc.get_or_build(self.client, "src", build_fused, rank=0, world=1, user_key="held",
                                           timeout=60))
            except Exception as e:
                got.append(e)
        g = threading.Thread(target=run)
        g.start()
        return g, got

    def test_an_entry_another_process_is_still_writing_is_waited_for_then_used(self):
        name, release, fail, t, errors = self._hold_entry_unpublished(lambda k: json.dumps(k, sort_keys=True).encode())
        g, got = self._get_or_build_on_a_thread()
        time.sleep(0.5)
        self.assertTrue(g.is_alive(), "get_or_build did not wait for the entry being written: %r" % got)
        release.set()
        t.join(30)
        g.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], sc.CacheEntry, got)
        self.assertEqual(got[0].name, name)
        self.assertEqual(got[0].checkpoint.generation, self.client.attach(name).generation)
        self.assertTrue(torch.equal(got[0].tensors["qkv"], build_fused(self.client.attach("src"), 0, 1)["qkv"]))

    def test_an_entry_whose_other_writer_fails_is_built_and_published_here(self):
        name, release, fail, t, errors = self._hold_entry_unpublished(lambda k: json.dumps(k, sort_keys=True).encode())
        g, got = self._get_or_build_on_a_thread()
        time.sleep(0.5)
        fail.set()
        release.set()
        t.join(30)
        g.join(30)
        self.assertEqual(len(errors), 1)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], sc.CacheEntry, got)
        self.assertFalse(got[0].hit)
        self.assertEqual(got[0].name, name)
        self.assertTrue(torch.equal(got[0].tensors["qkv"], build_fused(self.client.attach("src"), 0, 1)["qkv"]))

    def test_an_entry_published_with_another_key_is_an_error(self):
        name, release, fail, t, errors = self._hold_entry_unpublished(lambda k: b'{"other": 1}')
        g, got = self._get_or_build_on_a_thread()
        time.sleep(0.3)
        release.set()
        t.join(30)
        g.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], ckpt.FailedPrecondition, got)
        self.assertIn("another key", str(got[0]))

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


if __name__ == "__main__":
    unittest.main()
