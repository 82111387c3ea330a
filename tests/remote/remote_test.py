#!/usr/bin/python3
"""Remote sources (issue 26) against the real ckptd and real servers on 127.0.0.1.

s3rver (npm, tools/install-deps.sh) and nginx (TLS with a CA made here by openssl, Range,
If-Match) serve safetensors files and sharded folders; a fault-injecting proxy (this file,
standard library) sits in front of either when a test needs 503s, SlowDown, dropped
connections, truncated bodies or lying sizes. Loads are compared byte for byte with the
files (ckptctl persist writes the loaded tensors back out). The daemon under test gets an
explicit environment: HOME in the scratch directory, no AWS_* or proxy variable of the host.

Usage: remote_test.py   (CKPTD_BIN, CKPTCTL_BIN, CKPT_S3RVER set by ctest; exit 77 = skip)
"""
import http.client
import json
import os
import random
import shutil
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

CKPTD = os.environ.get("CKPTD_BIN", "")
CKPTCTL = os.environ.get("CKPTCTL_BIN", "")
S3RVER = os.environ.get("CKPT_S3RVER", "/var/cache/ckpt-remote-test/s3rver/node_modules/.bin/s3rver")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
KEY, SECRET = "S3RVER", "S3RVER"  # s3rver's built-in account
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def safetensors(tensors, seed):
    """bytes of a safetensors file with `tensors` [(name, n float32)] of seeded random data."""
    rng = random.Random(seed)
    header, data, at = {}, b"", 0
    for name, n in tensors:
        blob = rng.randbytes(4 * n)
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + len(blob)]}
        data += blob
        at += len(blob)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def tensors_of(blob):
    """name -> bytes of a safetensors file's tensors."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    return {k: blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


class FaultProxy:
    """A reverse proxy to `upstream` (host, port) that spoils requests on demand: `plan` is a
    list of faults taken one per GET (None: forward untouched) -- "503", "slowdown", "drop"
    (close without answering), "truncate" (headers, half the body, close), "lie" (a 206 whose
    Content-Length and body are shorter than its Content-Range); `always` spoils every one."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.plan, self.always, self.lock, self.requests = [], None, threading.Lock(), []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                while True:
                    line = self.rfile.readline()
                    if not line:
                        return
                    headers = []
                    while True:
                        h = self.rfile.readline()
                        if h in (b"\r\n", b"\n", b""):
                            break
                        headers.append(h.decode().rstrip("\r\n"))
                    method, path, _ = line.decode().split(" ", 2)
                    with proxy.lock:
                        fault = proxy.always or (proxy.plan.pop(0) if proxy.plan else None)
                        proxy.requests.append((method, path, fault))
                    if fault == "drop":
                        return
                    if fault in ("503", "slowdown"):
                        body = (b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                                if fault == "slowdown" else b"<Error><Code>ServiceUnavailable</Code></Error>")
                        self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                        continue
                    conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                    hdrs = {}
                    for h in headers:
                        k, v = h.split(":", 1)
                        hdrs[k.strip()] = v.strip()
                    conn.request(method, path, headers=hdrs)
                    resp = conn.getresponse()
                    body = resp.read()
                    out = [f"HTTP/1.1 {resp.status} {resp.reason}"]
                    for k, v in resp.getheaders():
                        if k.lower() in ("content-length", "connection", "transfer-encoding", "keep-alive"):
                            continue
                        if fault == "lie" and k.lower() == "content-range":
                            continue
                        out.append(f"{k}: {v}")
                    if fault == "lie" and resp.status == 206:
                        cr = resp.getheader("Content-Range")
                        out.append(f"Content-Range: {cr}")
                        body = body[:len(body) // 2]
                    out.append(f"Content-Length: {len(body)}")
                    self.wfile.write(("\r\n".join(out) + "\r\n\r\n").encode())
                    if fault == "truncate":
                        self.wfile.write(body[:len(body) // 2])
                        self.wfile.flush()
                        return
                    self.wfile.write(body)
                    self.wfile.flush()

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, plan=(), always=None):
        with self.lock:
            self.plan, self.always, self.requests = list(plan), always, []

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """A private ckptd with an explicit environment (no host AWS or proxy settings)."""

    def __init__(self, scratch, args, env=None):
        self.dir = tempfile.mkdtemp(dir=scratch)
        self.sock = os.path.join(self.dir, "ckptd.sock")
        self.pause = os.path.join(self.dir, "pause")
        os.mkdir(self.pause)
        home = os.path.join(self.dir, "home")
        os.mkdir(home)
        e = {"PATH": "/usr/bin:/bin", "HOME": home, "CKPT_PAUSE_DIR": self.pause,
             "CKPTD_CONFIG": os.path.join(self.dir, "empty.conf")}
        open(e["CKPTD_CONFIG"], "w").close()
        e.update(env or {})
        self.log = open(os.path.join(self.dir, "ckptd.log"), "w")
        self.prefix = "ckrt%d%d" % (os.getpid(), random.randrange(1 << 30))
        self.proc = subprocess.Popen([CKPTD, "--socket", self.sock, "--shm-prefix", self.prefix, "--state-dir",
                                      os.path.join(self.dir, "state"), "--log-level", "debug", "--cleanup-on-exit"] + args,
                                     env=e, stdout=self.log, stderr=self.log)
        for _ in range(600):
            if os.path.exists(self.sock) and self.ctl("status").returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("ckptd did not start: " + open(os.path.join(self.dir, "ckptd.log")).read())

    def ctl(self, *args):
        return subprocess.run([CKPTCTL, "--socket", self.sock, "--json"] + list(args), capture_output=True, text=True,
                              timeout=120)

    def log_text(self):
        self.log.flush()
        return open(os.path.join(self.dir, "ckptd.log")).read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


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
        # s3rver
        cls.s3dir = os.path.join(cls.scratch, "s3")
        os.mkdir(cls.s3dir)
        cls.s3log = open(os.path.join(cls.scratch, "s3rver.log"), "w+")
        cls.s3 = subprocess.Popen([S3RVER, "-d", cls.s3dir, "-a", "127.0.0.1", "-p", "0", "--configure-bucket", "models"],
                                  stdout=cls.s3log, stderr=subprocess.STDOUT)
        cls.s3port = None
        for _ in range(400):
            cls.s3log.seek(0)
            text = cls.s3log.read()
            if "listening on" in text:
                cls.s3port = int(text.split("listening on")[1].split(":")[1].split()[0])
                break
            time.sleep(0.05)
        if not cls.s3port:
            raise RuntimeError("s3rver did not start")
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
        conf = os.path.join(cls.scratch, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""daemon off; master_process off; worker_processes 1;
error_log {cls.scratch}/nginx-error.log; pid {cls.scratch}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log {cls.scratch}/nginx-access.log;
  client_body_temp_path {cls.scratch}/nginx-tmp; proxy_temp_path {cls.scratch}/nginx-tmp;
  fastcgi_temp_path {cls.scratch}/nginx-tmp; uwsgi_temp_path {cls.scratch}/nginx-tmp; scgi_temp_path {cls.scratch}/nginx-tmp;
  server {{ listen 127.0.0.1:{cls.https_port} ssl; ssl_certificate {tls}/srv.pem; ssl_certificate_key {tls}/srv.key;
           root {cls.www}; }}
  server {{ listen 127.0.0.1:{cls.http_port}; root {cls.www}; }}
}}
""")
        cls.nginx = subprocess.Popen([NGINX, "-p", cls.scratch, "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(cls.scratch, "nginx.out"), "w"))
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", cls.http_port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        cls.proxy_s3 = FaultProxy(("127.0.0.1", cls.s3port))
        cls.proxy_www = FaultProxy(("127.0.0.1", cls.http_port))

    @classmethod
    def tearDownClass(cls):
        cls.proxy_s3.close()
        cls.proxy_www.close()
        for p in (cls.s3, cls.nginx):
            p.terminate()
            p.wait(30)
        shutil.rmtree(cls.scratch, ignore_errors=True)

    @classmethod
    def put(cls, key, data):
        """PUTs an object into s3rver (unsigned: s3rver accepts anonymous writes)."""
        conn = http.client.HTTPConnection("127.0.0.1", cls.s3port, timeout=30)
        conn.request("PUT", "/models/" + key, body=data, headers={"Content-Length": str(len(data))})
        r = conn.getresponse()
        r.read()
        assert r.status == 200, (key, r.status)

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
        out = tempfile.mkdtemp(dir=self.scratch)
        r = d.ctl("persist", name, os.path.join(out, "p"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = {}
        for root, _, files in os.walk(out):
            for f in files:
                if f.endswith(".safetensors"):
                    got.update(tensors_of(open(os.path.join(root, f), "rb").read()))
        self.assertEqual(sorted(got), sorted(expected))
        for k in expected:
            self.assertEqual(got[k], expected[k], k)
        self.assertEqual(d.ctl("verify", name).returncode, 0)

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
        with PausePoint(d.pause, "remote-first-range") as p:
            proc = subprocess.Popen([CKPTCTL, "--socket", d.sock, "--json", "load", "s3://models/mid.safetensors"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            p.wait_reached()
            self.put("mid.safetensors", safetensors([("a", 300000), ("b", 500000), ("c", 7)], 99))
        out, err = proc.communicate(timeout=120)
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn("changed while it was being loaded", out + err)
        self.assertIn("s3://models/mid.safetensors", out + err)
        self.assertEqual(self.names(d), [])

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

    def test_s3_missing_bucket(self):
        d = self.s3_daemon(["--remote-allow", "s3://nobucket/"])
        self.assertIn("no such bucket", self.load(d, "s3://nobucket/x.safetensors", ok=False))

    def test_s3_wrong_credentials(self):
        d = self.s3_daemon(env={"AWS_ACCESS_KEY_ID": "WRONGKEY"})
        msg = self.load(d, "s3://models/one.safetensors", ok=False)
        self.assertIn("InvalidAccessKeyId", msg)
        self.assertIn("access denied", msg)
        self.assertNotIn(SECRET + "x", msg)

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
        with PausePoint(d.pause, "remote-first-range") as p:
            proc = subprocess.Popen([CKPTCTL, "--socket", d.sock, "--json", "load",
                                     f"https://127.0.0.1:{self.https_port}/mid.safetensors"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            p.wait_reached()
            self.write_www("mid.safetensors", safetensors([("a", 300000), ("b", 500000), ("c", 7)], 98),
                           mtime=time.time() + 100)
        out, err = proc.communicate(timeout=120)
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn("changed while it was being loaded", out + err)
        self.assertIn("412", out + err)
        self.assertEqual(self.names(d), [])

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


class PausePoint:
    """A pause point of the daemon (src/common/pause_point.h), armed for one stop."""

    def __init__(self, directory, name):
        self.reached, self.resume = os.path.join(directory, name + ".reached"), os.path.join(directory, name + ".resume")

    def __enter__(self):
        os.mkfifo(self.reached)
        os.mkfifo(self.resume)
        return self

    def wait_reached(self, timeout_s=60):
        # Non-blocking, so a daemon that never gets there fails the test instead of hanging it.
        fd = os.open(self.reached, os.O_RDONLY | os.O_NONBLOCK)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    if os.read(fd, 1):
                        return
                except BlockingIOError:
                    pass
                time.sleep(0.02)
            raise AssertionError("the daemon never reached the pause point")
        finally:
            os.close(fd)

    def __exit__(self, *exc):
        # Disarm first (later passes do not stop), then let the stopped thread go on: it
        # already opened nothing but .reached, and opens .resume by name next.
        os.unlink(self.reached)
        fd = os.open(self.resume, os.O_RDWR)  # does not block; the daemon's open for reading proceeds
        os.unlink(self.resume)
        time.sleep(0)  # no timing: the daemon reads EOF once our descriptor closes
        os.close(fd)


if __name__ == "__main__":
    for tool in (CKPTD, CKPTCTL, S3RVER, NGINX, shutil.which("openssl")):
        if not tool or not os.path.exists(tool):
            print(f"skip: {tool!r} is missing (tools/install-deps.sh installs it)")
            sys.exit(77)
    unittest.main()
