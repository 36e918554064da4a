"""Long polls of shoal-control's topology (issue 13.1): GET /v1/topology?after=V is held until
a newer version exists (then answered at once with it) or --poll-timeout passes (304), while
the listener goes on serving everything else; at most --poll-max are held."""

import threading
import time

import pytest

from mcraw import wait_until


class Poll(threading.Thread):
    """GET /v1/topology?after=V in the background; .status, .body, .done_at when answered."""

    def __init__(self, ctl, after, timeout=30):
        super().__init__(daemon=True)
        self.ctl, self.after, self.timeout = ctl, after, timeout
        self.status = self.body = self.done_at = None
        self.started_at = time.monotonic()
        self.start()

    def run(self):
        self.status, self.body = self.ctl.get(f"/v1/topology?after={self.after}",
                                              timeout=self.timeout)
        self.done_at = time.monotonic()


@pytest.fixture
def ctl(start_control):
    c = start_control("--poll-timeout", "20")
    assert c.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    return c


def held(ctl):
    return ctl.metrics()["shoal_control_polls_held"]


def test_poll_behind_the_current_version_is_answered_at_once(ctl):
    status, doc = ctl.get("/v1/topology?after=0", timeout=2)
    assert status == 200 and doc["version"] == 1


def test_poll_returns_promptly_on_a_change(ctl):
    p = Poll(ctl, 1)
    wait_until(lambda: held(ctl) == 1, message="the poll to be held")
    assert p.status is None  # still waiting: nothing changed
    changed_at = time.monotonic()
    assert ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})[0] == 201
    p.join(5)
    assert p.status == 200
    assert p.body["version"] == 2 and "catalog" in p.body["namespaces"]
    assert p.done_at - changed_at < 1.0
    assert held(ctl) == 0


def test_every_held_poll_is_answered_by_one_change(ctl):
    polls = [Poll(ctl, 1) for _ in range(20)]
    wait_until(lambda: held(ctl) == 20, message="20 polls held")
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    for p in polls:
        p.join(5)
        assert p.status == 200 and p.body["version"] == 2
    assert ctl.metrics()["shoal_control_polls_answered_total"] == 20


def test_poll_times_out_with_304(start_control):
    ctl = start_control("--poll-timeout", "1")
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    t0 = time.monotonic()
    status, body = ctl.get("/v1/topology?after=1", timeout=10)
    elapsed = time.monotonic() - t0
    assert status == 304 and body is None
    assert 0.9 <= elapsed < 3.0, elapsed
    assert ctl.metrics()["shoal_control_polls_timed_out_total"] == 1


def test_held_polls_do_not_block_other_requests(ctl):
    polls = [Poll(ctl, 1) for _ in range(8)]
    wait_until(lambda: held(ctl) == 8, message="8 polls held")
    t0 = time.monotonic()
    assert ctl.get("/healthz", timeout=2) == (200, "ok\n")
    assert ctl.get("/v1/namespaces", timeout=2)[0] == 200
    assert ctl.put("/v1/namespaces/default", {"max_ttl": 60})[0] == 200
    assert time.monotonic() - t0 < 3.0  # blocked, they would wait for the 20 s poll timeout
    for p in polls:
        p.join(5)
        assert p.status == 200 and p.body["namespaces"]["default"]["max_ttl"] == 60


def test_polls_past_poll_max_are_refused_503(start_control):
    ctl = start_control("--poll-max", "2", "--poll-timeout", "20")
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    polls = [Poll(ctl, 1) for _ in range(2)]
    wait_until(lambda: ctl.metrics()["shoal_control_polls_held"] == 2, message="2 polls held")
    status, err = ctl.get("/v1/topology?after=1", timeout=2)
    assert status == 503 and err["rule"] == "poll_max"
    assert ctl.metrics()["shoal_control_polls_refused_total"] == 1
    ctl.post("/v1/namespaces", {"name": "x", "pool": "main"})
    for p in polls:
        p.join(5)
        assert p.status == 200


def test_poll_max_must_leave_room_for_other_requests(tmp_path):
    import subprocess
    from controlharness import CONTROL_BIN
    r = subprocess.run([str(CONTROL_BIN), "--poll-max", "1024", "--admin-conn-max", "1024",
                        "--data-dir", str(tmp_path / "d")], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and "--poll-max" in r.stderr


@pytest.mark.parametrize("query", ["after=", "after=x", "after=-1", "after=1.5", "since=3"])
def test_bad_poll_query_is_refused(ctl, query):
    status, err = ctl.get(f"/v1/topology?{query}", timeout=2)
    assert status == 400 and err["field"] in ("after", "query"), err


def test_shutdown_answers_held_polls_and_exits_cleanly(ctl):
    polls = [Poll(ctl, 1) for _ in range(3)]
    wait_until(lambda: held(ctl) == 3, message="3 polls held")
    assert ctl.stop() is None  # exit status 0 within the stop timeout
    for p in polls:
        p.join(5)
        assert p.status == 304


def raw_get(ctl, path, headers):
    """(status, headers dict (lower-case names), body bytes) without decoding."""
    import http.client
    conn = http.client.HTTPConnection(ctl.host, ctl.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_topology_is_gzipped_for_a_client_that_asks(ctl):
    import gzip
    import json
    status, hdrs, body = raw_get(ctl, "/v1/topology?after=0", {"Accept-Encoding": "gzip"})
    assert status == 200 and hdrs.get("content-encoding") == "gzip"
    plain = raw_get(ctl, "/v1/topology?after=0", {})
    assert "content-encoding" not in plain[1]
    assert gzip.decompress(body) == plain[2]  # the same document, compressed
    assert json.loads(plain[2])["version"] == 1


def test_held_poll_answer_names_its_version_in_a_header(ctl):
    import json
    out = {}
    t = threading.Thread(target=lambda: out.update(r=raw_get(
        ctl, "/v1/topology?after=1", {"Accept-Encoding": "deflate, gzip;q=1.0"})), daemon=True)
    t.start()
    wait_until(lambda: held(ctl) == 1, message="the poll to be held")
    assert ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})[0] == 201
    t.join(5)
    status, hdrs, body = out["r"]
    assert status == 200 and hdrs["x-shoal-version"] == "2"
    assert hdrs["content-encoding"] == "gzip"
    import gzip
    assert json.loads(gzip.decompress(body))["version"] == 2


def test_gzip_refused_with_q0_gets_plain_text(ctl):
    status, hdrs, body = raw_get(ctl, "/v1/topology", {"Accept-Encoding": "gzip;q=0"})
    assert status == 200 and "content-encoding" not in hdrs
    assert body.startswith(b"{")
