"""shoal-control for the integration tests: start_control starts build/bin/shoal-control (or
SHOAL_CONTROL_BIN) on a free port (-p 0, read back from --port-file) with its own data
directory, and stops it after the test, failing the test if it died or did not exit cleanly.

    ctl = start_control()                      # fresh data directory
    ctl2 = start_control(data_dir=ctl.data_dir)  # same state, e.g. after ctl.kill9()
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:1"]})
"""

import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from mcraw import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTROL_BIN = REPO_ROOT / os.environ.get("SHOAL_CONTROL_BIN", "build/bin/shoal-control")
STOP_TIMEOUT = 5.0


class Control:
    """One running shoal-control."""

    def __init__(self, args, proc, port, data_dir, stderr_path):
        self.args, self.proc, self.port = args, proc, port
        self.data_dir, self.stderr_path = Path(data_dir), stderr_path
        self.host = "127.0.0.1"

    def request(self, method, path, body=None, timeout=10.0):
        """(status, parsed JSON or text or None). A dict/list body is sent as JSON, a str as is."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = json.dumps(body) if isinstance(body, (dict, list)) else body
            conn.request(method, path, body=data,
                         headers={"Content-Type": "application/json"} if data is not None else {})
            r = conn.getresponse()
            text = r.read().decode()
        finally:
            conn.close()
        if not text:
            return r.status, None
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None):
        return self.request("POST", path, body if body is not None else {})

    def put(self, path, body):
        return self.request("PUT", path, body)

    def delete(self, path):
        return self.request("DELETE", path)

    def topology(self):
        status, doc = self.get("/v1/topology")
        assert status == 200, doc
        return doc

    def version(self):
        return self.topology()["version"]

    def metrics(self):
        """{series name (labels included): value} from /metrics."""
        status, text = self.get("/metrics")
        assert status == 200
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def alive(self):
        return self.proc.poll() is None

    def stderr_text(self):
        try:
            return Path(self.stderr_path).read_text(errors="replace")
        except OSError:
            return ""

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT)

    def stop(self):
        """SIGTERM; a problem description unless it exits 0 within STOP_TIMEOUT, else None."""
        if self.proc.poll() is not None:
            return None
        self.proc.terminate()
        try:
            status = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            return f"did not exit within {STOP_TIMEOUT}s of SIGTERM"
        return None if status == 0 else f"exited with status {status} after SIGTERM"


def launch_control(tmp_dir, data_dir, *extra, die_with_parent=None):
    if not CONTROL_BIN.exists():
        pytest.fail(f"control binary {CONTROL_BIN} not found: build it with `make`")
    data_dir = Path(data_dir)
    port_file = Path(tempfile.mkdtemp(prefix="control-port-", dir=tmp_dir)) / "port"
    args = [str(CONTROL_BIN), "-p", "0", "--port-file", str(port_file),
            "--data-dir", str(data_dir), *extra]
    fd, stderr_path = tempfile.mkstemp(prefix="control-", suffix=".stderr", dir=tmp_dir)
    with os.fdopen(fd, "w") as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True, preexec_fn=die_with_parent)

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"shoal-control exited with status {proc.returncode}: {' '.join(args)}\n"
                        f"{Path(stderr_path).read_text(errors='replace')}")
        return port_file.exists() and port_file.read_text().strip()

    port = int(wait_until(ready, timeout=10, interval=0.02, message="shoal-control's port file"))
    return Control(args, proc, port, data_dir, stderr_path)


@pytest.fixture
def start_control(request, tmp_path):
    """Factory: start_control(*flags, data_dir=None) -> Control (a fresh data directory unless
    one is given). Every one started is stopped after the test."""
    from conftest import _die_with_parent, _register
    started = []

    def start(*extra, data_dir=None):
        if data_dir is None:
            data_dir = tmp_path / f"control-data-{len(started)}"
        c = launch_control(tmp_path, data_dir, *extra, die_with_parent=_die_with_parent)
        started.append(c)
        _register(request.node, c)
        return c

    yield start
    problems = []
    for c in started:
        died = c.proc.returncode is None and not c.alive()
        problem = c.stop()
        if died:
            problems.append(f"shoal-control died during the test with status {c.proc.returncode}")
        elif problem:
            problems.append(f"shoal-control {problem}")
        if problems:
            pytest.fail(f"{problems[-1]}: {' '.join(c.args)}\nstderr:\n{c.stderr_text()}")
