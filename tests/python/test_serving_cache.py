"""ckpt.serving_cache against the real daemon: a rank's processed tensors are built once,
published, and attached on the next call; another layout, dtype, user key, source
generation or source content misses; N processes racing for one entry all get it, one
entry is left; evict_stale removes entries whose source changed or went away."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import torch

import ckpt
import ckpt.serving_cache as sc
from test_ckpt import Daemon, make_checkpoint


def write_safetensors(path, tensors):
    make_checkpoint.write_safetensors(path, tensors, metadata=None)


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


def _run(argv):
    return subprocess.run(argv, capture_output=True, text=True)


class _TempUser:
    """A user (no home, no login) in `groups`, deleted by cleanup()."""
    _n = 0

    def __init__(self, groups=()):
        _TempUser._n += 1
        self.name = "ckpy%dx%d" % (os.getpid() % 100000, _TempUser._n)
        argv = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"]
        if groups:
            argv += ["--groups", ",".join(groups)]
        r = _run(argv + [self.name])
        if r.returncode != 0:
            raise unittest.SkipTest("useradd: " + r.stderr)
        import pwd
        self.uid = pwd.getpwnam(self.name).pw_uid

    def python(self, code, *args):
        """Runs `code` with this interpreter as this user; returns its stdout (raises on failure)."""
        env = dict(os.environ)
        r = subprocess.run(["setpriv", "--reuid", self.name, "--regid", self.name, "--init-groups", "--",
                            sys.executable, "-c", code] + [str(a) for a in args],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise AssertionError("as %s: %s\n%s" % (self.name, r.stdout, r.stderr))
        return r.stdout

    def cleanup(self):
        _run(["userdel", self.name])


# Run as a writer user: argv = socket, mode, victim uid (mode "attack": publish poisoned
# tensors under the victim's key and name, first; "own": publish poisoned ones under this
# user's own key; "victim": get_or_build, printing hit and the first value).
_AS_USER = r'''
import json, sys, torch, ckpt, ckpt.serving_cache as sc
socket, mode, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = ckpt.connect(socket)
src = client.attach("src")
poison = {"qkv": torch.full((12, 4), 666.0)}
if mode == "attack":
    key = sc.cache_key(src, rank=0, world=1, user_key="k", publisher=victim)
    out = []
    for name in (sc.cache_name(key), sc.cache_name(key)[len("u%d." % victim):]):  # its name; the old, flat one
        try:
            client.publish(name, poison, replace=True,
                           side_files={sc.KEY_FILE: json.dumps(key, sort_keys=True).encode()})
            out.append("published " + name)
        except ckpt.PermissionDenied as e:
            out.append("refused: " + str(e))
    print(json.dumps(out))
elif mode == "own":
    e = sc.get_or_build(client, "src", lambda s, r, w: poison, rank=0, world=1, user_key=sys.argv[4])
    print(json.dumps({"hit": e.hit, "name": e.name}))
else:
    trusted = [int(u) for u in sys.argv[4].split(",") if u] if len(sys.argv) > 4 else []
    def build(s, r, w):
        return {"qkv": torch.cat([s.tensor(n) for n in ("q", "k", "v")], 0).clone() * 2}
    e = sc.get_or_build(client, "src", build, rank=0, world=1, user_key=sys.argv[5] if len(sys.argv) > 5 else "k",
                        trusted=trusted)
    print(json.dumps({"hit": e.hit, "name": e.name, "first": float(e.tensors["qkv"].flatten()[0]),
                      "owner": e.checkpoint.owner_uid}))
'''


class ServingCacheOwnershipTest(unittest.TestCase):
    """Issue 23: a serving-cache hit only on an entry its caller (or a uid it trusts)
    published, as two real writer users against the real daemon."""

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to create users")
        self.groups = []
        for g in ("w", "r"):
            name = "ckpyg%s%d" % (g, os.getpid() % 100000)
            if _run(["groupadd", name]).returncode != 0:
                self.skipTest("groupadd failed")
            self.groups.append(name)
        writers, readers = self.groups
        self.victim = _TempUser([writers, readers])
        self.attacker = _TempUser([writers, readers])
        self.tmp = tempfile.TemporaryDirectory()
        os.chmod(self.tmp.name, 0o755)
        self.daemon = Daemon(self.tmp.name)
        self.daemon.proc = subprocess.Popen(
            [os.environ["CKPTD_BIN"], "--socket", self.daemon.socket, "--shm-prefix", self.daemon.prefix,
             "--state-dir", os.path.join(self.tmp.name, "state"), "--cleanup-on-exit", "--socket-mode", "0666",
             "--writer-group", writers, "--reader-group", readers],
            stdout=self.daemon.log, stderr=self.daemon.log)
        self.client = ckpt.connect(self.daemon.socket, wait=10)
        self.path = os.path.join(self.tmp.name, "src.safetensors")
        write_safetensors(self.path, source(1))
        self.client.load(self.path, "src")
        self.expected = float((torch.cat([source(1)[n] for n in ("q", "k", "v")], 0) * 2).flatten()[0])

    def tearDown(self):
        self.client = None
        self.daemon.cleanup()
        self.tmp.cleanup()
        self.victim.cleanup()
        self.attacker.cleanup()
        for g in self.groups:
            _run(["groupdel", g])

    def as_victim(self, trusted="", user_key="k"):
        return json.loads(self.victim.python(_AS_USER, self.daemon.socket, "victim", self.victim.uid, trusted,
                                             user_key))

    def test_another_writer_can_neither_plant_nor_squat_the_victims_entry(self):
        # The attacker goes first, with every part of the victim's key (all public).
        out = json.loads(self.attacker.python(_AS_USER, self.daemon.socket, "attack", self.victim.uid))
        self.assertTrue(out[0].startswith("refused:"), out)
        self.assertIn("reserved for uid %d" % self.victim.uid, out[0])
        self.assertTrue(out[1].startswith("published"), out)  # the flat name: the victim never looks there
        got = self.as_victim()
        self.assertFalse(got["hit"], got)
        self.assertEqual(got["first"], self.expected)
        self.assertEqual(got["owner"], self.victim.uid)
        again = self.as_victim()
        self.assertTrue(again["hit"], again)
        self.assertEqual(again["first"], self.expected)
        # Nor can the attacker replace the victim's entry now that it exists.
        out = json.loads(self.attacker.python(_AS_USER, self.daemon.socket, "attack", self.victim.uid))
        self.assertTrue(out[0].startswith("refused:"), out)
        self.assertEqual(self.as_victim()["first"], self.expected)

    def test_an_entry_of_an_untrusted_uid_is_never_hit_and_of_a_trusted_one_is(self):
        own = json.loads(self.attacker.python(_AS_USER, self.daemon.socket, "own", self.victim.uid, "t"))
        self.assertFalse(own["hit"])
        self.assertTrue(own["name"].startswith("u%d." % self.attacker.uid), own)
        untrusted = self.as_victim(trusted="", user_key="t")
        self.assertFalse(untrusted["hit"], untrusted)
        self.assertEqual(untrusted["first"], self.expected)
        trusted = self.as_victim(trusted=str(self.attacker.uid), user_key="t2")
        self.assertFalse(trusted["hit"], "nothing of either under user_key t2 yet")
        json.loads(self.attacker.python(_AS_USER, self.daemon.socket, "own", self.victim.uid, "t3"))
        hit = self.as_victim(trusted=str(self.attacker.uid), user_key="t3")
        self.assertTrue(hit["hit"], hit)
        self.assertEqual(hit["owner"], self.attacker.uid)
        self.assertEqual(hit["first"], 666.0)
