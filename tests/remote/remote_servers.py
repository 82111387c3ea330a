"""The servers and the daemon that the remote-source tests run (issue 26), standard library only.

Shared by remote_test.py (remote.sources) and cluster_cache_test.py (remote.cluster_cache):
  - safetensors() / tensors_of(): seeded test files and their tensors;
  - S3rver: s3rver (npm, tools/install-deps.sh) on 127.0.0.1 with one bucket;
  - Nginx: nginx in the foreground with a config of the caller's `http` block;
  - FaultProxy: a reverse proxy that spoils requests on demand, verifies SigV4 on demand
    (s3rver does not), and records every answer it forwarded (status, body bytes);
  - Daemon: a private ckptd with an explicit environment, optionally run under a command
    prefix (`ip netns exec NS`);
  - PausePoint: one stop at a daemon pause point (src/common/pause_point.h).
Every wait is a bounded poll for a condition, never a sleep that hopes to win a race.
"""
import hashlib
import hmac
import http.client
import json
import os
import random
import shutil
import socket
import socketserver
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse

CKPTD = os.environ.get("CKPTD_BIN", "")
CKPTCTL = os.environ.get("CKPTCTL_BIN", "")
S3RVER = os.environ.get("CKPT_S3RVER", "/var/cache/ckpt-remote-test/s3rver/node_modules/.bin/s3rver")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
KEY, SECRET = "S3RVER", "S3RVER"  # s3rver's built-in account
REGION = "us-east-1"
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what, timeout_s=30):
    """Polls `condition()` until true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def port_open(host, port):
    try:
        socket.create_connection((host, port), 0.2).close()
        return True
    except OSError:
        return False


def safetensors(tensors, seed):
    """bytes of a safetensors file with `tensors` [(name, n float32)] of seeded random data."""
    rng = random.Random(seed)
    header, data, at = {}, [], 0
    for name, n in tensors:
        blob = rng.randbytes(4 * n)
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + len(blob)]}
        data.append(blob)
        at += len(blob)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(data)


def tensors_of(blob):
    """name -> bytes of a safetensors file's tensors."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    return {k: blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def s3_error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
            f'</Error>').encode()


class S3rver:
    """s3rver on 127.0.0.1 (a free port it picks) with `bucket`, its data under `scratch`."""

    def __init__(self, scratch, bucket="models"):
        self.bucket = bucket
        data = os.path.join(scratch, "s3")
        os.mkdir(data)
        self.log = open(os.path.join(scratch, "s3rver.log"), "w+")
        self.proc = subprocess.Popen([S3RVER, "-d", data, "-a", "127.0.0.1", "-p", "0", "--configure-bucket", bucket],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None

        def listening():
            self.log.seek(0)
            text = self.log.read()
            if "listening on" in text:
                self.port = int(text.split("listening on")[1].split(":")[1].split()[0])
            return self.port is not None or self.proc.poll() is not None

        wait_for(listening, "s3rver to listen")
        if not self.port:
            raise RuntimeError("s3rver did not start")

    def put(self, key, data):
        """PUTs an object (unsigned: s3rver accepts anonymous writes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("PUT", f"/{self.bucket}/{key}", body=data, headers={"Content-Length": str(len(data))})
        r = conn.getresponse()
        r.read()
        conn.close()
        assert r.status == 200, (key, r.status)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


class Nginx:
    """nginx in the foreground (no master), prefix `scratch`, with `http_body` as the inside
    of its `http {}` block; waits until every (host, port) of `listen` accepts."""

    def __init__(self, scratch, http_body, listen, name="nginx"):
        tmp = os.path.join(scratch, name + "-tmp")
        os.makedirs(tmp, exist_ok=True)
        self.conf = os.path.join(scratch, name + ".conf")
        self.error_log = os.path.join(scratch, name + "-error.log")
        self.access_log = os.path.join(scratch, name + "-access.log")
        with open(self.conf, "w") as f:
            f.write(f"""daemon off; master_process off; worker_processes 1;
error_log {self.error_log} info; pid {scratch}/{name}.pid;
events {{ worker_connections 1024; }}
http {{
  access_log {self.access_log};
  client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
{http_body}
}}
""")
        with open(os.path.join(scratch, name + ".out"), "w") as out:
            self.proc = subprocess.Popen([NGINX, "-p", scratch, "-c", self.conf], stdout=subprocess.DEVNULL, stderr=out)
        try:
            wait_for(lambda: self.proc.poll() is not None or all(port_open(h, p) for h, p in listen), "nginx to listen")
        except AssertionError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError("nginx did not start: " + open(os.path.join(scratch, name + ".out")).read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)


class SigV4Verifier:
    """Checks AWS Signature V4 (header form, AWS4-HMAC-SHA256) of a request as S3 does,
    from the known secret: the canonical request of method, URI, query, the SignedHeaders
    and x-amz-content-sha256. check() returns None when the request is signed right (or is
    unsigned and `require` is off), else (code, message) of the S3 error to answer."""

    def __init__(self, key=KEY, secret=SECRET, region=REGION, service="s3", require=False):
        self.key, self.secret, self.region, self.service, self.require = key, secret, region, service, require

    @staticmethod
    def _encode(s):
        return urllib.parse.quote(s, safe="-_.~")

    def canonical_query(self, query):
        pairs = []
        for part in query.split("&") if query else []:
            k, _, v = part.partition("=")
            pairs.append((self._encode(urllib.parse.unquote(k)), self._encode(urllib.parse.unquote(v))))
        return "&".join(f"{k}={v}" for k, v in sorted(pairs))

    def check(self, method, target, headers):
        """`headers`: [(name, value)] as received."""
        auth = next((v for k, v in headers if k.lower() == "authorization"), None)
        if auth is None:
            return ("AccessDenied", "Access Denied") if self.require else None
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return ("AccessDenied", "Unsupported authorization type")
        fields = {}
        for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        try:
            key, date, region, service, terminal = fields["Credential"].split("/")
            signed, signature = fields["SignedHeaders"], fields["Signature"]
        except (KeyError, ValueError):
            return ("AuthorizationHeaderMalformed", "The authorization header is malformed")
        if key != self.key:
            return ("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
        if (region, service, terminal) != (self.region, self.service, "aws4_request"):
            return ("AuthorizationHeaderMalformed", "The authorization header is malformed; wrong scope")
        by_name = {}
        for k, v in headers:
            by_name.setdefault(k.lower(), []).append(" ".join(v.strip().split()))
        names = signed.split(";")
        if "host" not in names or any(n not in by_name for n in names):
            return ("SignatureDoesNotMatch", "A signed header is missing from the request")
        amz_date = by_name.get("x-amz-date", [""])[0]
        if not amz_date.startswith(date):
            return ("SignatureDoesNotMatch", "x-amz-date does not match the credential scope")
        payload = by_name.get("x-amz-content-sha256", [hashlib.sha256(b"").hexdigest()])[0]
        path, _, query = target.partition("?")
        canonical = "\n".join([method, path, self.canonical_query(query),
                               "".join(f"{n}:{','.join(by_name[n])}\n" for n in names), signed, payload])
        scope = f"{date}/{region}/{service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = ("AWS4" + self.secret).encode()
        for part in (date, region, service, "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        want = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, signature):
            return ("SignatureDoesNotMatch",
                    "The request signature we calculated does not match the signature you provided. "
                    "Check your key and signing method.")
        return None


class FaultProxy:
    """A reverse proxy to `upstream` (host, port) that spoils requests on demand: `plan` is a
    list of faults taken one per GET (None: forward untouched) -- "503", "slowdown", "drop"
    (close without answering), "truncate" (headers, half the body, close), "lie" (a 206 whose
    Content-Length and body are shorter than its Content-Range); `always` spoils every one.
    `verifier` (a SigV4Verifier, or None) answers 403 with its S3 error before forwarding.
    `served` records every answer, before its bytes are sent (a client that has read an answer
    finds it recorded): (method, path, Range header, status, body bytes)."""

    def __init__(self, upstream, listen="127.0.0.1", verifier=None):
        self.upstream = upstream
        self.plan, self.always, self.verifier = [], None, verifier
        self.lock, self.requests, self.served = threading.Lock(), [], []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def answer(self, status, reason, body, method, path, rng):
                with proxy.lock:  # before the bytes: a client that has read them finds it recorded
                    proxy.served.append((method, path, rng, status, len(body)))
                self.wfile.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, reason.encode(), len(body), body))
                self.wfile.flush()

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
                        k, v = h.decode().rstrip("\r\n").split(":", 1)
                        headers.append((k.strip(), v.strip()))
                    method, path, _ = line.decode().split(" ", 2)
                    length = int(next((v for k, v in headers if k.lower() == "content-length"), "0"))
                    body_in = self.rfile.read(length) if length else None
                    rng = next((v for k, v in headers if k.lower() == "range"), None)
                    with proxy.lock:
                        fault = proxy.always or (proxy.plan.pop(0) if proxy.plan else None)
                        proxy.requests.append((method, path, fault))
                        verifier = proxy.verifier
                    if fault == "drop":
                        return
                    if fault in ("503", "slowdown"):
                        body = (s3_error("SlowDown", "Please reduce your request rate.") if fault == "slowdown"
                                else s3_error("ServiceUnavailable", "Service Unavailable"))
                        self.answer(503, "Service Unavailable", body, method, path, rng)
                        continue
                    refused = verifier.check(method, path, headers) if verifier else None
                    if refused:
                        self.answer(403, "Forbidden", s3_error(*refused), method, path, rng)
                        continue
                    conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                    conn.request(method, path, body=body_in, headers=dict(headers))
                    resp = conn.getresponse()
                    body = resp.read()
                    conn.close()
                    out = [f"HTTP/1.1 {resp.status} {resp.reason}"]
                    for k, v in resp.getheaders():
                        if k.lower() in ("content-length", "connection", "transfer-encoding", "keep-alive"):
                            continue
                        if fault == "lie" and k.lower() == "content-range":
                            continue
                        out.append(f"{k}: {v}")
                    if fault == "lie" and resp.status == 206:
                        out.append(f"Content-Range: {resp.getheader('Content-Range')}")
                        body = body[:len(body) // 2]
                    out.append(f"Content-Length: {len(body)}")
                    sent = len(body) // 2 if fault == "truncate" else len(body)
                    with proxy.lock:  # before the bytes, as in answer()
                        proxy.served.append((method, path, rng, resp.status, sent))
                    self.wfile.write(("\r\n".join(out) + "\r\n\r\n").encode())
                    self.wfile.write(body[:sent])
                    self.wfile.flush()
                    if fault == "truncate":
                        return

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server((listen, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, plan=(), always=None):
        with self.lock:
            self.plan, self.always, self.requests, self.served = list(plan), always, [], []

    def answers(self):
        with self.lock:
            return list(self.served)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """A private ckptd with an explicit environment (no host AWS or proxy settings): its own
    socket, shm prefix, state dir and HOME under a fresh directory in `scratch`. `wrap` is a
    command prefix it runs under (["ip", "netns", "exec", NS]: that execs ckptd itself)."""

    def __init__(self, scratch, args, env=None, wrap=()):
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
        self.log_path = os.path.join(self.dir, "ckptd.log")
        self.log = open(self.log_path, "w")
        self.prefix = "ckrt%d%d" % (os.getpid(), random.randrange(1 << 30))
        self.proc = subprocess.Popen(list(wrap) + [CKPTD, "--socket", self.sock, "--shm-prefix", self.prefix,
                                                   "--state-dir", os.path.join(self.dir, "state"), "--log-level",
                                                   "debug", "--cleanup-on-exit"] + list(args),
                                     env=e, stdout=self.log, stderr=self.log)
        try:
            wait_for(lambda: self.proc.poll() is not None or (os.path.exists(self.sock) and
                                                              self.ctl("status").returncode == 0), "ckptd to serve")
        except AssertionError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError("ckptd did not start: " + self.log_text())

    def ctl(self, *args):
        return subprocess.run([CKPTCTL, "--socket", self.sock, "--json"] + list(args), capture_output=True, text=True,
                              timeout=120)

    def ctl_async(self, *args):
        """ckptctl started, not awaited (communicate() it)."""
        return subprocess.Popen([CKPTCTL, "--socket", self.sock, "--json"] + list(args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


class PausePoint:
    """A pause point of the daemon (src/common/pause_point.h), armed for one stop. Its reading
    end of .reached stays open until the point is disarmed, as tests/support's
    PausePointControl keeps it: another thread that reaches the armed point then opens and
    writes it, and goes on when the point is disarmed, instead of waiting for a reader forever."""

    def __init__(self, directory, name):
        self.reached, self.resume = os.path.join(directory, name + ".reached"), os.path.join(directory, name + ".resume")
        self.reached_fd = None

    def __enter__(self):
        os.mkfifo(self.reached)
        os.mkfifo(self.resume)
        # Non-blocking, so a daemon that never gets there fails the test instead of hanging it.
        self.reached_fd = os.open(self.reached, os.O_RDONLY | os.O_NONBLOCK)
        return self

    def wait_reached(self, timeout_s=60, given_up=lambda: False):
        """Returns once the daemon stands there; AssertionError after `timeout_s` or as soon as
        `given_up()` says it never will (the load ended)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not given_up():
            try:
                if os.read(self.reached_fd, 1):
                    return
            except BlockingIOError:
                pass
            time.sleep(0.02)
        raise AssertionError("the daemon never reached the pause point")

    def __exit__(self, *exc):
        # Disarm first (later passes do not stop), then let the stopped threads go on: they
        # open .resume by name, and read it to end of file.
        os.unlink(self.reached)
        fd = os.open(self.resume, os.O_RDWR)  # does not block; the daemon's open for reading proceeds
        os.unlink(self.resume)
        os.close(fd)  # the daemon reads EOF once our descriptor closes
        os.close(self.reached_fd)  # only now: no thread can open .reached by name any more


def persisted_tensors(d, name, scratch):
    """name -> bytes of checkpoint `name` of daemon `d`, written back out by ckptctl persist.
    (returncode, output) of persist instead when it fails."""
    out = tempfile.mkdtemp(dir=scratch)
    r = d.ctl("persist", name, os.path.join(out, "p"))
    if r.returncode != 0:
        return r.returncode, r.stdout + r.stderr
    got = {}
    for root, _, files in os.walk(out):
        for f in files:
            if f.endswith(".safetensors"):
                with open(os.path.join(root, f), "rb") as fh:
                    got.update(tensors_of(fh.read()))
    shutil.rmtree(out, ignore_errors=True)
    return got
