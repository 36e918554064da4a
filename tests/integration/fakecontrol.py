"""A stand-in for shoal-control's topology API, for follower tests (shoal-router --control): an
HTTP server on 127.0.0.1 in a thread of the test that serves the document a test publishes.

- GET /v1/topology: the document (503 while none is published).
- GET /v1/topology?after=V: held until a version > V is published (then 200 with it), or for
  `hold` seconds (then 304 with no body), as the control plane's long-poll contract says.
- POST /v1/routers (and /v1/nodes, shoal-node's): recorded in `registrations` and answered
  `routers_status` (201; 404 plays a control plane without the call).
- `stop()` closes the listener and every open connection (a control plane that died);
  `start()` listens again on the same port.
- `fail_status`: when set, every request is answered with that status (a sick control plane).
- `silent`: while true, requests are read but left unanswered (a control plane cut off by a
  partition: the follower's own timeouts fire); answered normally once it is false again.
- Any other POST (`/v1/leases`, `/v1/reports`, ...) is recorded: `posts(path)` lists the bodies,
  `wait_post(path, pred)` awaits one; `answer(path, fn)` sets its reply, fn(body) -> (status,
  dict); without one it is answered 200 `{}`, but `/v1/leases`, which is granted a 600 s lease
  at the version published (as shoal-control grants one), so nodes' replicated slots serve.
"""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ports import free_port


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeControl:
    def __init__(self, hold=2.0):
        self.hold = hold
        self.cond = threading.Condition()
        self.text, self.version = None, 0
        self.registrations, self.gets = [], []
        self.auths = []  # each request's Authorization header (None when absent)
        self.routers_status = 201
        self.fail_status = None
        self.silent = False
        self._posts, self._answers = {}, {}
        self.port = free_port()  # start() listens here again after a stop()
        self._conns = set()
        self._httpd = None
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def publish(self, doc, version=None):
        """Serve `doc` (a dict, or raw text for a broken document) from now on, waking held
        polls. `version` is what the long-poll compares (default: doc["version"])."""
        with self.cond:
            self.text = doc if isinstance(doc, str) else json.dumps(doc)
            self.version = version if version is not None else doc["version"]
            self.cond.notify_all()

    def start(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the router's client reuses one connection

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with fake.cond:
                    fake._conns.add(self.connection)

            def finish(self):
                with fake.cond:
                    fake._conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def _send(self, status, body=b""):
                self.send_response(status)
                if status != 304:
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body and status != 304:
                    self.wfile.write(body)

            def _hold_while_silent(self):
                while fake.silent and fake._httpd is self.server:
                    time.sleep(0.02)

            def do_GET(self):
                fake.auths.append(self.headers.get("Authorization"))
                self._hold_while_silent()
                parts = urlsplit(self.path)
                if fake.fail_status:
                    return self._send(fake.fail_status, b'{"error": "sick"}')
                if parts.path != "/v1/topology":
                    return self._send(404, b'{"error": "no such resource"}')
                query = parse_qs(parts.query)
                after = int(query["after"][0]) if "after" in query else None
                fake.gets.append(after)
                deadline = time.monotonic() + fake.hold
                with fake.cond:
                    if after is not None:
                        while fake.version <= after and fake._httpd is self.server:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            fake.cond.wait(left)
                        if fake.version <= after:
                            return self._send(304)
                    if fake.fail_status:  # fell sick while the poll was held
                        return self._send(fake.fail_status, b'{"error": "sick"}')
                    if fake.text is None:
                        return self._send(503, b'{"error": "no topology yet"}')
                    body = fake.text.encode()
                return self._send(200, body)

            def do_POST(self):
                fake.auths.append(self.headers.get("Authorization"))
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                self._hold_while_silent()
                if fake.fail_status:
                    return self._send(fake.fail_status, b'{"error": "sick"}')
                path = urlsplit(self.path).path
                if path not in ("/v1/routers", "/v1/nodes"):
                    try:
                        doc = json.loads(body) if body else None
                    except ValueError:
                        doc = body
                    with fake.cond:
                        fake._posts.setdefault(path, []).append(doc)
                        fn = fake._answers.get(path)
                        fake.cond.notify_all()
                    if fn:
                        status, reply = fn(doc)
                    elif path == "/v1/leases" and isinstance(doc, dict):
                        # as a real control plane does: a lease (long here) at the version in use
                        status, reply = 200, {"node": doc.get("node"), "lease_ms": 600000,
                                              "version": fake.version}
                    else:
                        status, reply = 200, {}
                    return self._send(status, json.dumps(reply).encode())
                fake.registrations.append(json.loads(body))
                self._send(fake.routers_status, b"{}")

        httpd = _Server(("127.0.0.1", self.port), Handler)
        self.port = httpd.server_address[1]
        with self.cond:
            self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def answer(self, path, fn):
        """fn(body) -> (status, reply dict) answers every later POST to `path`."""
        with self.cond:
            self._answers[path] = fn

    def posts(self, path):
        """The bodies POSTed to `path` so far (parsed JSON), oldest first."""
        with self.cond:
            return list(self._posts.get(path, []))

    def wait_post(self, path, pred=lambda body: True, timeout=10.0):
        """The first body POSTed to `path` (earlier ones count) for which pred holds; an
        AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for body in self._posts.get(path, []):
                    if pred(body):
                        return body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no POST to {path} matching within {timeout} s "
                                         f"({len(self._posts.get(path, []))} others)")
                self.cond.wait(left)

    def stop(self):
        """Close the listener and drop every connection, held polls included."""
        httpd = self._httpd
        with self.cond:
            self._httpd = None
            conns = list(self._conns)
            self.cond.notify_all()
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
