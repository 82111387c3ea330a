#!/usr/bin/python3
"""Remote sources (issue 26) against the real ckptd and real servers on 127.0.0.1.

s3rver (npm, tools/install-deps.sh) and nginx (TLS with a CA made here by openssl, Range,
If-Match) serve safetensors files and sharded folders; a fault-injecting proxy (remote_servers.py,
standard library) sits in front of either when a test needs 503s, SlowDown, dropped
connections, truncated bodies or lying sizes, or a SigV4 check (s3rver checks only the key id). Loads are compared byte for byte with the
files (ckptctl persist writes the loaded tensors back out). The daemon under test gets an
explicit environment: HOME in the scratch directory, no AWS_* or proxy variable of the host.

Usage: remote_test.py   (CKPTD_BIN, CKPTCTL_BIN, CKPT_S3RVER set by ctest; exit 77 = skip)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from remote_servers import (CKPTCTL, CKPTD, KEY, NGINX, S3RVER, SECRET, Daemon, FaultProxy, Nginx, PausePoint, S3rver,
                            SigV4Verifier, free_port, persisted_tensors, safetensors, tensors_of)


class RemoteTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.mkdtemp(prefix="ckpt-remote-")
        cls.files = {}
        cls.files["one.safetensors"] = safetensors([("a", 300000), ("b", 500000), ("c", 7)], 1)  # ~3.2 MB
        cls.files["shard-1.safetensors"] = safetensors([("w1", 400000), ("w2", 3)], 2)
        cls.files["shard-2.safetensors"] = safetensors([("w3", 600000)], 3)
        index = {"metadata": {"total_size": 0}, "weight_map": {"w1": "model-00001-of-00002.safetensors",
                                                                "w2": "model-00001-of-00002.safetensors",
                                                                "w3": "model-00002-of-00002.safetensors"}}
        cls.index = json.dumps(index).encode()
        cls.config = b'{"model_type": "test"}'
        cls.s3 = S3rver(cls.scratch)
        cls.s3port = cls.s3.port
        cls.put("one.safetensors", cls.files["one.safetensors"])
        cls.put("repo/model.safetensors.index.json", cls.index)
        cls.put("repo/model-00001-of-00002.safetensors", cls.files["shard-1.safetensors"])
        cls.put("repo/model-00002-of-00002.safetensors", cls.files["shard-2.safetensors"])
        cls.put("repo/config.json", cls.config)
        cls.put("listed/only.safetensors", cls.files["one.safetensors"])
        # nginx with TLS (a CA of our own)
        cls.www = os.path.join(cls.scratch, "www")
        os.makedirs(os.path.join(cls.www, "repo"))
        cls.write_www("one.safetensors", cls.files["one.safetensors"])
        cls.write_www("repo/model.safetensors.index.json", cls.index)
        cls.write_www("repo/model-00001-of-00002.safetensors", cls.files["shard-1.safetensors"])
        cls.write_www("repo/model-00002-of-00002.safetensors", cls.files["shard-2.safetensors"])
        cls.write_www("repo/config.json", cls.config)
        cls.ca = os.path.join(cls.scratch, "ca.pem")
        tls = os.path.join(cls.scratch, "tls")
        os.mkdir(tls)
        run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=tls)
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", cls.ca, "-days", "2",
            "-subj", "/CN=ckpt test CA")
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj",
            "/CN=127.0.0.1")
        with open(os.path.join(tls, "ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        run("openssl", "x509", "-req", "-in", "srv.csr", "-CA", cls.ca, "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "srv.pem", "-days", "2", "-extfile", "ext")
        cls.https_port, cls.http_port = free_port(), free_port()
        cls.nginx = Nginx(cls.scratch, f"""
  server {{ listen 127.0.0.1:{cls.https_port} ssl; ssl_certificate {tls}/srv.pem; ssl_certificate_key {tls}/srv.key;
           root {cls.www}; }}
  server {{ listen 127.0.0.1:{cls.http_port}; root {cls.www}; }}
""", [("127.0.0.1", cls.https_port), ("127.0.0.1", cls.http_port)])
        cls.proxy_s3 = FaultProxy(("127.0.0.1", cls.s3port))
        cls.proxy_www = FaultProxy(("127.0.0.1", cls.http_port))
        cls.proxy_verify = FaultProxy(("127.0.0.1", cls.s3port), verifier=SigV4Verifier(require=True))

    @classmethod
    def tearDownClass(cls):
        cls.proxy_s3.close()
        cls.proxy_www.close()
        cls.proxy_verify.close()
        cls.s3.stop()
        cls.nginx.stop()
        shutil.rmtree(cls.scratch, ignore_errors=True)

    @classmethod
    def put(cls, key, data):
        cls.s3.put(key, data)

    @classmethod
    def write_www(cls, rel, data, mtime=None):
        """Replaces www/rel atomically (a new inode; `mtime` moves the ETag nginx computes)."""
        path = os.path.join(cls.www, rel)
        with open(path + ".new", "wb") as f:
            f.write(data)
        if mtime:
            os.utime(path + ".new", (mtime, mtime))
        os.rename(path + ".new", path)

    def s3_daemon(self, extra=(), env=None, endpoint=None):
        e = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}
        e.update(env or {})
        args = ["--remote-allow", "s3://models/", "--remote-endpoint", endpoint or f"http://127.0.0.1:{self.s3port}",
                "--remote-path-style", "--remote-chunk", "1MiB", "--remote-retry-base", "0.01", "--remote-retry-max",
                "0.05", "--remote-attempts", "4"] + list(extra)
        d = Daemon(self.scratch, args, e)
        self.addCleanup(d.stop)
        return d

    def www_daemon(self, extra=()):
        args = ["--remote-allow", f"https://127.0.0.1:{self.https_port}/", "--remote-allow",
                f"http://127.0.0.1:{self.proxy_www.port}/", "--remote-ca-file", self.ca, "--remote-chunk", "1MiB",
                "--remote-retry-base", "0.01", "--remote-retry-max", "0.05", "--remote-attempts", "4"] + list(extra)
        d = Daemon(self.scratch, args)
        self.addCleanup(d.stop)
        return d

    def load(self, d, src, *args, ok=True, op="load"):
        r = d.ctl(op, src, *args)
        if ok:
            self.assertEqual(r.returncode, 0, f"{src}: {r.stdout} {r.stderr}\n{d.log_text()[-3000:]}")
            return json.loads(r.stdout)
        self.assertNotEqual(r.returncode, 0, f"{src} loaded but should not: {r.stdout}")
        return json.loads(r.stdout)["message"] if r.stdout.strip().startswith("{") else r.stderr

    def assert_bytes(self, d, name, expected):
        """The loaded checkpoint `name` holds exactly `expected` (name -> bytes)."""
        got = persisted_tensors(d, name, self.scratch)
        self.assertIsInstance(got, dict, got)
        self.assertEqual(sorted(got), sorted(expected))
        for k in expected:
            self.assertEqual(got[k], expected[k], k)
        self.assertEqual(d.ctl("verify", name).returncode, 0)

    def load_replaced_mid_load(self, d, src, replace):
        """Loads `src` on `d` (one connection), calling `replace()` while the daemon stands at
        the pause point after the first range landed; the load must fail as a changed object
        and publish nothing. Returns ckptctl's output (stdout + stderr)."""
        with PausePoint(d.pause, "remote-first-range") as p:
            proc = d.ctl_async("load", src)
            p.wait_reached()
            replace()
        out, err = proc.communicate(timeout=120)
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn("changed while it was being loaded", out + err)
        self.assertIn(src, out + err)
        self.assertEqual(self.names(d), [])
        return out + err

    def names(self, d):
        return [c["name"] for c in json.loads(d.ctl("list").stdout)["checkpoints"]]

    # --- S3 -----------------------------------------------------------------------------

    def test_s3_file_and_folder(self):
        d = self.s3_daemon()
        self.load(d, "s3://models/one.safetensors", "--name", "one")
        self.assert_bytes(d, "one", tensors_of(self.files["one.safetensors"]))
        r = self.load(d, "s3://models/repo/", "--name", "repo")
        self.assertEqual(r["checkpoint"]["format"], "safetensors-sharded")
        want = tensors_of(self.files["shard-1.safetensors"]) | tensors_of(self.files["shard-2.safetensors"])
        self.assert_bytes(d, "repo", want)
        # a prefix without the index nor model.safetensors: the listing's one file
        self.load(d, "s3://models/listed/", "--name", "listed")
        self.assert_bytes(d, "listed", tensors_of(self.files["one.safetensors"]))
        # the credentials never show
        for out in (d.ctl("list").stdout, d.ctl("status").stdout, d.ctl("info", "one").stdout, d.log_text()):
            self.assertNotIn("AWS_SECRET", out)
            self.assertNotIn("SECRET_SENTINEL", out)

    def test_s3_credentials_never_logged(self):
        d = self.s3_daemon(env={"AWS_SESSION_TOKEN": "SECRET_SENTINEL_TOKEN"})
        self.load(d, "s3://models/one.safetensors", "--name", "one")
        for out in (d.ctl("list").stdout, d.ctl("status").stdout, d.ctl("info", "one").stdout, d.log_text()):
            self.assertNotIn("SECRET_SENTINEL", out)

    def test_s3_credentials_from_systemd_credentials_directory(self):
        creds = tempfile.mkdtemp(dir=self.scratch)
        with open(os.path.join(creds, "aws-credentials"), "w") as f:
            f.write(f"[default]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
        d = self.s3_daemon(env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "CREDENTIALS_DIRECTORY": creds})
        self.load(d, "s3://models/one.safetensors", "--name", "one")
        self.assertIn("aws-credentials", d.log_text())

    def test_s3_ensure_follows_etag(self):
        d = self.s3_daemon()
        self.put("ens.safetensors", self.files["shard-1.safetensors"])
        self.assertEqual(self.load(d, "s3://models/ens.safetensors", op="ensure")["action"], "loaded")
        self.assertEqual(self.load(d, "s3://models/ens.safetensors", op="ensure")["action"], "current")
        self.put("ens.safetensors", self.files["shard-2.safetensors"])
        self.assertEqual(self.load(d, "s3://models/ens.safetensors", op="ensure")["action"], "reloaded")
        self.assert_bytes(d, "ens", tensors_of(self.files["shard-2.safetensors"]))

    def test_s3_replaced_mid_load(self):
        # One connection: after the first range lands the daemon pauses; the object is
        # replaced; the next range's response carries another ETag (s3rver ignores If-Match).
        d = self.s3_daemon(["--remote-connections", "1", "--remote-threads", "1"])
        self.put("mid.safetensors", self.files["one.safetensors"])
        self.load_replaced_mid_load(d, "s3://models/mid.safetensors", lambda: self.put(
            "mid.safetensors", safetensors([("a", 300000), ("b", 500000), ("c", 7)], 99)))

    def test_s3_bad_input(self):
        d = self.s3_daemon(["--memory-budget", "2MiB"])
        self.assertIn("no such object", self.load(d, "s3://models/missing.safetensors", ok=False))
        self.assertIn("not beneath", self.load(d, "s3://models-none/x.safetensors", ok=False))
        self.assertIn("not supported", self.load(d, "ftp://models/x.safetensors", ok=False))
        self.assertIn("no bucket", self.load(d, "s3:///x.safetensors", ok=False))
        self.assertIn("credentials in the URL", self.load(d, "https://u:p@127.0.0.1/x.safetensors", ok=False))
        self.assertIn("query strings", self.load(d, "s3://models/x.safetensors?X-Amz-Signature=1", ok=False))
        # larger than the budget: refused from the header's sizes, before the tensors are fetched
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertRegex(msg, "budget|memory")
        self.assertEqual(self.names(d), [])
        self.assertEqual(d.ctl("status").returncode, 0)  # still serving

    def mounted_tmpfs(self, options):
        """A tmpfs mounted with `options` on a fresh directory, unmounted at cleanup (after the
        daemons that use it stop), or a skip where mounting is not allowed (not root)."""
        path = tempfile.mkdtemp(dir=self.scratch)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options + ",mode=0700", "tmpfs", path], capture_output=True,
                           text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs: " + r.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", "-l", path])
        return path

    def test_s3_into_a_full_segment_directory(self):
        # No budget refuses it first: the tmpfs fills while the ranges land (pwrite: ENOSPC).
        small = self.mounted_tmpfs("size=2m")
        d = self.s3_daemon(["--segment-dir", small])
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertIn("no room in shared memory", msg)
        self.assertIn("file system full", msg)
        self.assertIn("s3://models/one.safetensors", msg)
        self.assertEqual(self.names(d), [])
        self.assertEqual(os.listdir(small), [])  # the partial segment is gone
        # the daemon serves, and the freed room takes a load that fits
        tiny = safetensors([("t", 1000)], 5)
        self.put("tiny.safetensors", tiny)
        self.load(d, "s3://models/tiny.safetensors", "--name", "tiny")
        self.assert_bytes(d, "tiny", tensors_of(tiny))

    def test_s3_onto_huge_pages(self):
        # A tmpfs of 2 MiB pages: the ranges are written into 2 MiB folios, holes populated.
        huge = self.mounted_tmpfs("size=64m,huge=always")
        d = self.s3_daemon(["--segment-dir", huge])
        self.load(d, "s3://models/repo/", "--name", "repo")
        want = tensors_of(self.files["shard-1.safetensors"]) | tensors_of(self.files["shard-2.safetensors"])
        self.assert_bytes(d, "repo", want)
        self.assertIn("2 MiB pages", d.ctl("status").stdout)

    def test_s3_missing_bucket(self):
        d = self.s3_daemon(["--remote-allow", "s3://nobucket/"])
        self.assertIn("no such bucket", self.load(d, "s3://nobucket/x.safetensors", ok=False))

    def test_s3_wrong_credentials(self):
        d = self.s3_daemon(env={"AWS_ACCESS_KEY_ID": "WRONGKEY"})
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertIn("InvalidAccessKeyId", msg)
        self.assertIn("access denied", msg)
        self.assertNotIn(SECRET + "x", msg)

    def test_sigv4_verifier_matches_aws_example(self):
        # The verifier against AWS's own worked example (S3 API reference, "Signature
        # Calculations for the Authorization Header", GET Object with a Range), so it is
        # checked against AWS's numbers and not only against libcurl's signatures.
        v = SigV4Verifier(key="AKIAIOSFODNN7EXAMPLE", secret="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", require=True)
        headers = [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9"),
                   ("x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
                   ("x-amz-date", "20130524T000000Z"),
                   ("Authorization", "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                    "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                    "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")]
        self.assertIsNone(v.check("GET", "/test.txt", headers))
        changed = [(k, "bytes=0-10" if k == "Range" else val) for k, val in headers]
        self.assertEqual(v.check("GET", "/test.txt", changed)[0], "SignatureDoesNotMatch")
        self.assertEqual(v.check("GET", "/test.txt", headers[:-1])[0], "AccessDenied")  # unsigned, required

    def test_s3_wrong_secret(self):
        # s3rver checks only the key id; the verifying proxy checks the signature itself.
        endpoint = f"http://127.0.0.1:{self.proxy_verify.port}"
        wrong = "WRONG-SECRET-SENTINEL"
        d = self.s3_daemon(env={"AWS_SECRET_ACCESS_KEY": wrong}, endpoint=endpoint)
        self.proxy_verify.set()
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertIn("s3://models/one.safetensors", msg)
        self.assertIn("access denied (HTTP 403 SignatureDoesNotMatch", msg)
        self.assertIn("check the daemon's credentials (from environment)", msg)
        self.assertEqual([a[3] for a in self.proxy_verify.answers()], [403])  # refused at once, not retried
        for out in (msg, d.ctl("list").stdout, d.ctl("status").stdout, d.log_text()):
            self.assertNotIn(wrong, out)
        self.assertEqual(self.names(d), [])
        self.assertEqual(d.ctl("status").returncode, 0)  # still serving
        # The right secret through the same verifier: libcurl's signatures pass it (file,
        # folder with side files and a 404 of a missing one, a listing with a query string).
        good = self.s3_daemon(endpoint=endpoint)
        self.proxy_verify.set()
        self.load(good, "s3://models/one.safetensors", "--name", "one")
        self.assert_bytes(good, "one", tensors_of(self.files["one.safetensors"]))
        self.load(good, "s3://models/repo/", "--name", "repo")
        self.assert_bytes(good, "repo", tensors_of(self.files["shard-1.safetensors"]) |
                          tensors_of(self.files["shard-2.safetensors"]))
        self.load(good, "s3://models/listed/", "--name", "listed")
        self.assert_bytes(good, "listed", tensors_of(self.files["one.safetensors"]))
        statuses = [a[3] for a in self.proxy_verify.answers()]
        self.assertNotIn(403, statuses)
        self.assertIn(206, statuses)

    def test_remote_disabled_and_not_allowed(self):
        d = Daemon(self.scratch, [])
        self.addCleanup(d.stop)
        self.assertIn("disabled", self.load(d, "s3://models/one.safetensors", ok=False))
        d2 = self.s3_daemon()
        self.assertIn("not beneath", self.load(d2, "s3://other/one.safetensors", ok=False))

    def test_s3_faults_retried(self):
        d = self.s3_daemon(endpoint=f"http://127.0.0.1:{self.proxy_s3.port}")
        for plan in (["503", "503"], ["slowdown"], ["drop", "drop"], [None, "truncate", "truncate"], [None, None, "drop"]):
            with self.subTest(plan=plan):
                self.proxy_s3.set(plan)
                self.load(d, "s3://models/one.safetensors", "--name", "one", "--replace")
                self.assert_bytes(d, "one", tensors_of(self.files["one.safetensors"]))
                self.assertGreater(len(self.proxy_s3.requests), len(plan))

    def test_s3_fault_that_never_clears(self):
        d = self.s3_daemon(endpoint=f"http://127.0.0.1:{self.proxy_s3.port}")
        for fault, cause in (("503", "HTTP 503"), ("drop", "giving up"), ("truncate", "giving up")):
            with self.subTest(fault=fault):
                self.proxy_s3.set(always=fault)
                t = time.monotonic()
                msg = self.load(d, "s3://models/one.safetensors", ok=False)
                self.assertIn(cause, msg)
                self.assertIn("s3://models/one.safetensors", msg)
                self.assertLess(time.monotonic() - t, 30)
        self.proxy_s3.set(always="lie")
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertIn("disagrees with Content-Range", msg)
        self.proxy_s3.set()
        self.assertEqual(self.names(d), [])

    # --- HTTPS (nginx) ------------------------------------------------------------------

    def test_https_file_and_folder(self):
        d = self.www_daemon()
        base = f"https://127.0.0.1:{self.https_port}/"
        self.load(d, base + "one.safetensors", "--name", "one")
        self.assert_bytes(d, "one", tensors_of(self.files["one.safetensors"]))
        r = self.load(d, base + "repo/", "--name", "repo")
        self.assertEqual(r["checkpoint"]["format"], "safetensors-sharded")
        want = tensors_of(self.files["shard-1.safetensors"]) | tensors_of(self.files["shard-2.safetensors"])
        self.assert_bytes(d, "repo", want)

    def test_https_untrusted_ca(self):
        d = Daemon(self.scratch, ["--remote-allow", f"https://127.0.0.1:{self.https_port}/"])
        self.addCleanup(d.stop)
        msg = self.load(d, f"https://127.0.0.1:{self.https_port}/one.safetensors", ok=False)
        self.assertRegex(msg, "certificate|SSL")

    def test_https_replaced_mid_load_412(self):
        d = self.www_daemon(["--remote-connections", "1", "--remote-threads", "1"])
        self.write_www("mid.safetensors", self.files["one.safetensors"])
        out = self.load_replaced_mid_load(d, f"https://127.0.0.1:{self.https_port}/mid.safetensors", lambda: self.write_www(
            "mid.safetensors", safetensors([("a", 300000), ("b", 500000), ("c", 7)], 98), mtime=time.time() + 100))
        self.assertIn("412", out)

    def test_http_faults_and_ensure(self):
        d = self.www_daemon()
        src = f"http://127.0.0.1:{self.proxy_www.port}/ens.safetensors"
        self.write_www("ens.safetensors", self.files["shard-1.safetensors"], mtime=time.time() - 100)
        self.proxy_www.set(["503", "drop", None, "truncate"])
        self.assertEqual(self.load(d, src, op="ensure")["action"], "loaded")
        self.assertEqual(self.load(d, src, op="ensure")["action"], "current")
        self.write_www("ens.safetensors", self.files["shard-2.safetensors"])
        self.assertEqual(self.load(d, src, op="ensure")["action"], "reloaded")
        self.assert_bytes(d, "ens", tensors_of(self.files["shard-2.safetensors"]))
        self.assertIn("no such object", self.load(d, f"http://127.0.0.1:{self.proxy_www.port}/nothing.safetensors",
                                                  ok=False))


if __name__ == "__main__":
    for tool in (CKPTD, CKPTCTL, S3RVER, NGINX, shutil.which("openssl")):
        if not tool or not os.path.exists(tool):
            print(f"skip: {tool!r} is missing (tools/install-deps.sh installs it)")
            sys.exit(77)
    unittest.main()
