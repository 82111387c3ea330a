#!/usr/bin/python3
"""Four simulated nodes load one model through one nginx cache (issue 26).

Each node is a network namespace of its own (a veth pair to this namespace) running its own
ckptd; the nodes' only way to storage is the nginx cache of docs/operations.md ("Remote
sources and a caching proxy"), which they use as their S3 endpoint (two more nodes reach it
through `http_proxy` instead, with the origin, unreachable to them, as endpoint). Behind nginx, the origin
is s3rver behind a pass-through (remote_servers.FaultProxy) that counts every body byte it
forwards and checks the SigV4 signature of any signed request (s3rver does not). Asserted:
every node's checkpoint equals the files byte for byte, and the origin served each byte of
each object exactly once (one answer per 8 MiB slice), whether the four load at once or one
after another; the only other answers are the 404s of side files that do not exist, and
S3 listings pass uncached.

Usage: cluster_cache_test.py   (root; CKPTD_BIN, CKPTCTL_BIN, CKPT_S3RVER set by ctest; 77 = skip)
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from remote_servers import (CKPTCTL, CKPTD, KEY, MIB, NGINX, S3RVER, SECRET, Daemon, FaultProxy, Nginx, PausePoint,
                            S3rver, SigV4Verifier, free_port, persisted_tensors, safetensors, tensors_of)

NODES = 4
SLICE = 8 * MIB  # nginx `slice`, as docs/operations.md sets it
# What ckptd asks for that may not exist: a folder's index and single file, its side files.
PROBED = ("model.safetensors.index.json", "model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "preprocessor_config.json")


def nginx_cache_config(cache_dir, listen, origin):
    """The `http {}` body of docs/operations.md's cache (keep the two the same), listening on
    each address of `listen`, in front of `origin` (host:port)."""
    listens = "\n".join(f"    listen {addr};" for addr in listen)
    return f"""
  log_format cache '$remote_addr "$request" $status $body_bytes_sent range="$http_range" cache=$upstream_cache_status';
  proxy_cache_path {cache_dir} levels=1:2 keys_zone=ckpt:64m max_size=500g inactive=7d use_temp_path=off;
  server {{
{listens}
    access_log {cache_dir}.log cache;
    location / {{
      slice                     8m;
      proxy_cache               ckpt;
      proxy_cache_key           $request_uri$slice_range;
      proxy_cache_bypass        $args;
      proxy_no_cache            $args;
      proxy_set_header          Range $slice_range;
      proxy_cache_valid         200 206 7d;
      proxy_cache_lock          on;
      proxy_cache_lock_timeout  20s;
      proxy_cache_lock_age      20s;
      proxy_ignore_headers      Cache-Control Expires Set-Cookie;
      proxy_set_header          Authorization "";
      proxy_set_header          X-Amz-Date "";
      proxy_set_header          X-Amz-Content-Sha256 "";
      proxy_set_header          X-Amz-Security-Token "";
      proxy_http_version        1.1;
      proxy_set_header          Connection "";
      proxy_pass                http://{origin};
    }}
  }}
"""


def ip(*args):
    subprocess.run(["ip"] + list(args), check=True, capture_output=True, text=True)


class ClusterCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.mkdtemp(prefix="ckpt-cluster-")
        cls.addClassCleanup(shutil.rmtree, cls.scratch, True)
        # A single file of 3 slices and a sharded folder whose shards span slices.
        cls.files = {
            "big.safetensors": safetensors([("a", 2_600_000), ("b", 2_600_000), ("c", 7)], 11),  # ~20.8 MB
            "repo/model-00001-of-00002.safetensors": safetensors([("w1", 2_300_000), ("w2", 5)], 12),  # ~9.2 MB
            "repo/model-00002-of-00002.safetensors": safetensors([("w3", 1_900_000)], 13),  # ~7.6 MB
            "repo/model.safetensors.index.json": json.dumps({"metadata": {}, "weight_map": {
                "w1": "model-00001-of-00002.safetensors", "w2": "model-00001-of-00002.safetensors",
                "w3": "model-00002-of-00002.safetensors"}}).encode(),
            "repo/config.json": b'{"model_type": "test"}',
            "listed/only.safetensors": safetensors([("x", 300_000)], 14),
            "viaproxy.safetensors": safetensors([("p", 2_200_000), ("q", 3)], 15),  # ~8.8 MB
            "replaced.safetensors": safetensors([("r", 2_600_000), ("s", 2_600_000)], 16),  # ~20.8 MB, 3 slices
        }
        cls.s3 = S3rver(cls.scratch)
        cls.addClassCleanup(cls.s3.stop)
        for key, data in cls.files.items():
            cls.s3.put(key, data)
        # The origin as nginx sees it: unsigned reads pass (a bucket the cache may read), a
        # signed request must carry a valid signature.
        cls.origin = FaultProxy(("127.0.0.1", cls.s3.port), verifier=SigV4Verifier(require=False))
        cls.addClassCleanup(cls.origin.close)
        # Four namespaces, each linked to this one by a veth pair: 10.231.<n>.<4i+1> here,
        # <4i+2> there. Names carry the pid (several runs at once do not collide).
        tag, net = os.getpid() % 100000, 10 + os.getpid() % 240
        cls.nodes = []
        for i in range(NODES):
            ns, here, there = f"ckc{tag}n{i}", f"ckc{tag}h{i}", f"ckc{tag}p{i}"
            ip("netns", "add", ns)
            cls.addClassCleanup(subprocess.run, ["ip", "netns", "del", ns], capture_output=True)
            ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
            cls.addClassCleanup(subprocess.run, ["ip", "link", "del", here], capture_output=True)
            ip("addr", "add", f"10.231.{net}.{4 * i + 1}/30", "dev", here)
            ip("link", "set", here, "up")
            ip("-n", ns, "addr", "add", f"10.231.{net}.{4 * i + 2}/30", "dev", there)
            ip("-n", ns, "link", "set", there, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            cls.nodes.append({"ns": ns, "cache": f"10.231.{net}.{4 * i + 1}", "addr": f"10.231.{net}.{4 * i + 2}"})
        cls.port = free_port()
        cache_dir = os.path.join(cls.scratch, "cache")
        cls.access_log = cache_dir + ".log"
        cls.nginx = Nginx(cls.scratch, nginx_cache_config(cache_dir, [f"{n['cache']}:{cls.port}" for n in cls.nodes],
                                                          f"127.0.0.1:{cls.origin.port}"),
                          [(n["cache"], cls.port) for n in cls.nodes])
        cls.addClassCleanup(cls.nginx.stop)
        # One ckptd per node, its endpoint the cache, with the credentials it would use for
        # S3 directly (the cache drops them), one thread (so a pause point stops it whole).
        for n in cls.nodes:
            n["daemon"] = cls.node_daemon(n, f"http://{n['cache']}:{cls.port}")

    @classmethod
    def node_daemon(cls, node, endpoint, env=None, extra=()):
        """A ckptd in `node`'s namespace with S3 endpoint `endpoint`."""
        e = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}
        e.update(env or {})
        args = ["--remote-allow", "s3://models/", "--remote-endpoint", endpoint, "--remote-path-style",
                "--remote-threads", "1", "--remote-connections", "16"] + list(extra)
        d = Daemon(cls.scratch, args, e, wrap=["ip", "netns", "exec", node["ns"]])
        cls.addClassCleanup(d.stop)
        return d

    def assert_loaded(self, d, name, keys):
        """`d`'s checkpoint `name` holds exactly the tensors of the files `keys`."""
        want = {}
        for k in keys:
            want |= tensors_of(self.files[k])
        got = persisted_tensors(d, name, self.scratch)
        self.assertIsInstance(got, dict, got)
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertEqual(got[k], want[k], f"{name}: tensor {k}")
        self.assertEqual(d.ctl("verify", name).returncode, 0)

    def assert_served_once(self, prefix, keys):
        """The origin's answers for keys under `prefix`: each object in `keys` exactly once,
        slice by slice (2xx bodies summing to its size, one answer per slice); besides them
        only 404s of absent probed files (PROBED). Returns the answers."""
        answers = [a for a in self.origin.answers() if a[1].startswith("/models/" + prefix)]
        for key in keys:
            mine = [a for a in answers if a[1] == "/models/" + key]
            ok = [a for a in mine if a[3] in (200, 206)]
            size = len(self.files[key])
            self.assertEqual(sum(a[4] for a in ok), size, f"{key}: bytes served by the origin: {mine}")
            self.assertEqual(len(ok), len(mine), f"{key}: {mine}")
            self.assertEqual(sorted(a[2] for a in ok),
                             sorted(f"bytes={s}-{s + SLICE - 1}" for s in range(0, size, SLICE)), key)
        known = {"/models/" + k for k in keys}
        for method, path, rng, status, n in answers:
            if path in known:
                continue
            self.assertEqual((method, status), ("GET", 404), path)
            self.assertIn(path.rsplit("/", 1)[1], PROBED, path)
            self.assertLess(n, 1024)
        return answers

    def test_four_nodes_at_once_single_file(self):
        # All four loads are forced to overlap: each daemon stops after its first range landed
        # (its other ranges already asked for), and all go on together once all four stand.
        keys = ["big.safetensors"]
        self.origin.set()
        with contextlib.ExitStack() as stack:
            points = [stack.enter_context(PausePoint(n["daemon"].pause, "remote-first-range")) for n in self.nodes]
            procs = [n["daemon"].ctl_async("load", "s3://models/big.safetensors", "--name", "big") for n in self.nodes]
            for p in points:
                p.wait_reached(given_up=lambda: any(proc.poll() is not None for proc in procs))
        for n, proc in zip(self.nodes, procs):
            out, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, f"{n['ns']}: {out} {err}\n{n['daemon'].log_text()[-3000:]}")
        for n in self.nodes:
            self.assert_loaded(n["daemon"], "big", keys)
        self.assert_served_once("big", keys)
        # Every node's requests went through the cache, and it answered them.
        with open(self.access_log) as f:
            log = f.read()
        for n in self.nodes:
            self.assertIn(f'{n["addr"]} "GET /models/big.safetensors', log)

    def test_four_nodes_one_after_another_sharded_folder(self):
        keys = ["repo/model.safetensors.index.json", "repo/model-00001-of-00002.safetensors",
                "repo/model-00002-of-00002.safetensors", "repo/config.json"]
        self.origin.set()
        for i, n in enumerate(self.nodes):
            r = n["daemon"].ctl("load", "s3://models/repo/", "--name", "repo")
            self.assertEqual(r.returncode, 0, f"{n['ns']}: {r.stdout} {r.stderr}\n{n['daemon'].log_text()[-3000:]}")
            self.assert_loaded(n["daemon"], "repo", [k for k in keys if k.endswith(".safetensors")])
            if i == 0:
                first = len([a for a in self.origin.answers() if a[3] != 404])
        answers = self.assert_served_once("repo/", keys)
        # Nodes 2 to 4 got every byte from the cache: no answer but 404s after the first.
        self.assertEqual(len([a for a in answers if a[3] != 404]), first)

    def test_listing_passes_uncached(self):
        # A prefix without index: ckptd lists it (ListObjectsV2, the only request with a query
        # string); the listing is never cached (a new upload shows at once), the object is.
        keys = ["listed/only.safetensors"]
        self.origin.set()
        for n in self.nodes[:2]:
            r = n["daemon"].ctl("load", "s3://models/listed/", "--name", "listed")
            self.assertEqual(r.returncode, 0, f"{n['ns']}: {r.stdout} {r.stderr}")
            self.assert_loaded(n["daemon"], "listed", keys)
        listings = [a for a in self.origin.answers() if "?" in a[1]]
        self.assertEqual([(a[1].split("?")[0], a[3]) for a in listings], [("/models/", 200)] * 2)
        self.assert_served_once("listed/", keys)

    def test_object_replaced_under_a_cache_is_never_mixed(self):
        # The cache holds the first slice of the old object; the object is replaced at the
        # origin (same size, other bytes, another ETag); a node's load gets the old slice from
        # the cache and the new ones from the origin: the ETags of its ranges disagree and the
        # load fails, naming the object, with nothing published. The origin itself has the new
        # object whole (a daemon that reaches it directly loads it).
        key, node = "replaced.safetensors", self.nodes[3]
        old = self.files[key]
        new = safetensors([("r", 2_600_000), ("s", 2_600_000)], 17)
        self.assertEqual(len(new), len(old))
        try:
            self.s3.put(key, old)
            cached = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-r", "0-99",
                                     f"http://{node['cache']}:{self.port}/models/{key}"], capture_output=True)
            self.assertEqual(cached.returncode, 0, cached.stderr)
            self.s3.put(key, new)
            d = node["daemon"]
            r = d.ctl("load", f"s3://models/{key}", "--name", "replaced")
            self.assertNotEqual(r.returncode, 0, f"a load mixing two versions succeeded: {r.stdout}")
            self.assertIn(f"s3://models/{key}", r.stdout + r.stderr)
            self.assertRegex(r.stdout + r.stderr, "changed while it was being loaded|ETag|giving up")
            self.assertNotIn("replaced", [c["name"] for c in json.loads(d.ctl("list").stdout)["checkpoints"]])
            self.assertEqual(d.ctl("status").returncode, 0)
            direct = Daemon(self.scratch, ["--remote-allow", "s3://models/", "--remote-endpoint",
                                           f"http://127.0.0.1:{self.s3.port}", "--remote-path-style"],
                            {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"})
            self.addCleanup(direct.stop)
            r = direct.ctl("load", f"s3://models/{key}", "--name", "replaced")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            got = persisted_tensors(direct, "replaced", self.scratch)
            self.assertEqual(got, tensors_of(new))
        finally:
            self.s3.put(key, old)

    def test_http_proxy_variable(self):
        # The other way of docs/operations.md: the endpoint is the origin itself (not reachable
        # from a node's namespace: 127.0.0.1 there is the node's own), the cache comes in
        # through the standard proxy variable, which ckptd leaves to libcurl.
        keys = ["viaproxy.safetensors"]
        origin = f"http://127.0.0.1:{self.origin.port}"
        self.origin.set()
        for n in self.nodes[:2]:
            d = self.node_daemon(n, origin, {"http_proxy": f"http://{n['cache']}:{self.port}"})
            r = d.ctl("load", "s3://models/viaproxy.safetensors", "--name", "viaproxy")
            self.assertEqual(r.returncode, 0, f"{n['ns']}: {r.stdout} {r.stderr}\n{d.log_text()[-3000:]}")
            self.assert_loaded(d, "viaproxy", keys)
        self.assert_served_once("viaproxy", keys)
        # Without the variable the origin is out of reach: the bytes above came through the cache.
        d = self.node_daemon(self.nodes[2], origin, extra=["--remote-attempts", "1"])
        r = d.ctl("load", "s3://models/viaproxy.safetensors", "--name", "viaproxy")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("connect", r.stdout + r.stderr)


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("skip: needs root (network namespaces)")
        sys.exit(77)
    for tool in (CKPTD, CKPTCTL, S3RVER, NGINX, shutil.which("ip")):
        if not tool or not os.path.exists(tool):
            print(f"skip: {tool!r} is missing (tools/install-deps.sh installs it)")
            sys.exit(77)
    probe = f"ckcprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        print("skip: cannot create network namespaces here")
        sys.exit(77)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    unittest.main()
