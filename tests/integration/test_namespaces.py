"""Namespaces on shoal-node: the admin API (/v1/namespaces), start-up files, TTL rules applied on
the data port, per-namespace figures in `stats namespaces` and /metrics. shoal only."""

import json
import threading

import pytest

from mcraw import accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only




@pytest.fixture
def node(start_server):
    port = free_port()
    srv = start_server("--admin-port", str(port))
    wait_until(lambda: accepts(port), timeout=5, message="the admin port to accept connections")
    srv.admin = port
    return srv


def ttl_of(raw, key):
    return int(raw.meta(f"mg {key} t").flags["t"])


def test_create_then_read_back(node):
    st, body = http(node.admin, "PUT", "/v1/namespaces/catalog",
                    {"memory": 67108864, "default_ttl": 600, "max_ttl": 86400, "eviction": "lfu"})
    assert st == 201, body
    st, body = http(node.admin, "GET", "/v1/namespaces/catalog")
    assert st == 200
    got = json.loads(body)
    assert (got["memory"], got["default_ttl"], got["max_ttl"], got["eviction"]) == \
        (67108864, 600, 86400, "lfu")
    st, body = http(node.admin, "GET", "/v1/namespaces")
    assert set(json.loads(body)["namespaces"]) == {"default", "catalog"}


@pytest.mark.parametrize("body, field", [
    ({"memory": -1}, "memory"),
    ({"default_ttl": "ten"}, "default_ttl"),
    ({"max_ttl": 10**9}, "max_ttl"),
    ({"eviction": "random"}, "eviction"),
    ({"colour": "blue"}, "colour"),
    ({"default_ttl": 100, "max_ttl": 50}, "default_ttl"),
])
def test_invalid_input_is_4xx_naming_the_field_and_changes_nothing(node, body, field):
    assert http(node.admin, "PUT", "/v1/namespaces/ns1", {"default_ttl": 5})[0] == 201
    st, text = http(node.admin, "PUT", "/v1/namespaces/ns1", body)
    assert 400 <= st < 500, text
    assert field in json.loads(text)["error"], text
    assert json.loads(http(node.admin, "GET", "/v1/namespaces/ns1")[1])["default_ttl"] == 5


def test_malformed_json_and_bad_names_are_400(node):
    assert http(node.admin, "PUT", "/v1/namespaces/x", b"{not json")[0] == 400
    assert http(node.admin, "PUT", "/v1/namespaces/bad%20name", {})[0] == 400


def test_default_ttl_applies_when_client_sends_zero(node):
    http(node.admin, "PUT", "/v1/namespaces/catalog", {"default_ttl": 600})
    r = node.raw()
    assert r.store("set", "catalog:v1:p1", b"x") == "STORED"
    assert r.store("set", "other:k", b"x") == "STORED"
    assert ttl_of(r, "catalog:v1:p1") in (599, 600)
    assert ttl_of(r, "other:k") == -1, "a key of an undefined namespace follows default"


def test_max_ttl_clamps_every_way_a_ttl_is_set(node):
    http(node.admin, "PUT", "/v1/namespaces/short", {"max_ttl": 30})
    r = node.raw()
    r.store("set", "short:a", b"x", exptime=99999)
    assert ttl_of(r, "short:a") in (29, 30)
    r.store("set", "short:never", b"x", exptime=0)
    assert ttl_of(r, "short:never") in (29, 30), "no TTL is longer than max_ttl"
    assert r.meta("ms short:m 1 T5000", b"x").code == "HD"
    assert ttl_of(r, "short:m") in (29, 30)
    assert r.cmd("touch short:a 99999") == "TOUCHED"
    assert ttl_of(r, "short:a") in (29, 30)


def test_changes_apply_without_restart_and_delete_falls_back(node):
    r = node.raw()
    r.store("set", "team:a", b"x")
    assert ttl_of(r, "team:a") == -1
    http(node.admin, "PUT", "/v1/namespaces/team", {"default_ttl": 100})
    r.store("set", "team:b", b"x")
    assert ttl_of(r, "team:b") in (99, 100)
    assert http(node.admin, "DELETE", "/v1/namespaces/team")[0] == 200
    r.store("set", "team:c", b"x")
    assert ttl_of(r, "team:c") == -1
    assert http(node.admin, "DELETE", "/v1/namespaces/team")[0] == 404
    assert http(node.admin, "DELETE", "/v1/namespaces/default")[0] == 400


def test_stats_namespaces_reports_per_namespace_figures(node):
    http(node.admin, "PUT", "/v1/namespaces/cat", {"memory": 1 << 20})
    r = node.raw()
    r.store("set", "cat:1", b"x")
    r.get("cat:1")
    r.get("cat:missing")
    r.cmd("delete cat:1")
    r.get("plain")
    st = r.stats("namespaces")
    assert st["ns:cat:quota"] == str(1 << 20)
    assert (st["ns:cat:sets"], st["ns:cat:get_hits"], st["ns:cat:get_misses"]) == ("1", "1", "1")
    assert st["ns:cat:deletes"] == "1"
    assert st["ns:cat:hit_ratio"] == "0.5000"
    assert st["ns:default:get_misses"] == "1"


def test_leases_count_per_namespace(node):
    http(node.admin, "PUT", "/v1/namespaces/lz", {})
    a, b = node.raw(), node.raw()
    assert "W" in a.meta("mg lz:k v c N30").flags
    assert "Z" in b.meta("mg lz:k v c N30").flags
    st = a.stats("namespaces")
    assert (st["ns:lz:lease_wins"], st["ns:lz:lease_waits"]) == ("1", "1")


def test_metrics_carry_namespace_labels(node):
    assert http(node.admin, "PUT", "/v1/namespaces/m1", {"memory": 2 << 20})[0] == 201
    node.raw().get("m1:k")
    st, text = http(node.admin, "GET", "/metrics")
    assert st == 200
    assert 'shoal_node_ns_get_misses_total{namespace="m1"} 1' in text
    assert f'shoal_node_ns_quota_bytes{{namespace="m1"}} {2 << 20}' in text


def test_namespaces_file_loads_at_start(start_server, tmp_path):
    f = tmp_path / "ns.json"
    f.write_text(json.dumps({"namespaces": {"fromfile": {"default_ttl": 321}}}))
    srv = start_server("--namespaces", str(f))
    r = srv.raw()
    r.store("set", "fromfile:k", b"x")
    assert ttl_of(r, "fromfile:k") in (320, 321)


def test_bad_namespaces_file_stops_start_with_the_field(tmp_path):
    import subprocess
    from conftest import server_binary
    f = tmp_path / "ns.json"
    f.write_text(json.dumps({"bad": {"max_ttl": "long"}}))
    p = subprocess.run([str(server_binary()), "-p", "0", "--namespaces", str(f)],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode != 0
    assert "max_ttl" in p.stderr and "bad" in p.stderr, p.stderr


def test_changes_under_load_lose_no_request(node):
    stop = threading.Event()
    errors = []

    def load():
        r = node.raw()
        i = 0
        while not stop.is_set():
            key = f"load:{i % 50}"
            if r.store("set", key, b"v") != "STORED":
                errors.append("set")
            if r.get(key)[0][2] != b"v":
                errors.append("get")
            i += 1

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(40):
        body = {"default_ttl": 100 + i} if i % 2 else {"max_ttl": 1000 + i}
        assert http(node.admin, "PUT", f"/v1/namespaces/{'load' if i % 3 else 'n' + str(i)}", body)[0] in (200, 201)
        if i % 5 == 4:
            http(node.admin, "DELETE", "/v1/namespaces/load")
    stop.set()
    for t in threads:
        t.join(10)
    assert errors == []


def test_engine_figures_per_namespace(node):
    http(node.admin, "PUT", "/v1/namespaces/fig", {})
    r = node.raw()
    for i in range(10):
        assert r.store("set", f"fig:{i}", b"x" * 100) == "STORED"
    r.store("set", "plain", b"y")
    st = r.stats("namespaces")
    assert st["ns:fig:items"] == "10"
    assert int(st["ns:fig:bytes"]) >= 10 * 100
    assert st["ns:default:items"] == "1"
    r.cmd("delete fig:0")
    assert r.stats("namespaces")["ns:fig:items"] == "9"


def test_expired_items_are_counted_for_their_namespace(node):
    http(node.admin, "PUT", "/v1/namespaces/brief", {"max_ttl": 1})
    r = node.raw()
    for i in range(20):
        r.store("set", f"brief:{i}", b"x")
    # the background sweeper reclaims them within about a second of expiry, unasked
    wait_until(lambda: r.stats("namespaces")["ns:brief:expired"] == "20", timeout=6,
               message="20 expired items of 'brief' reclaimed by the sweeper")
    assert r.stats("namespaces")["ns:brief:items"] == "0"


def test_evictions_are_counted_for_the_namespace_that_lost_items(start_server):
    port = free_port()
    srv = start_server("--admin-port", str(port), "-m", "2")
    wait_until(lambda: accepts(port), timeout=5, message="the admin port")
    http(port, "PUT", "/v1/namespaces/churn", {})
    r = srv.raw()
    for i in range(4000):
        r.send(f"set churn:{i} 0 0 1000 noreply\r\n".encode() + b"x" * 1000 + b"\r\n")
    assert r.cmd("mn") == "MN"
    st = r.stats("namespaces")
    assert int(st["ns:churn:evictions"]) > 0
    assert int(st["ns:churn:bytes"]) <= 2 * 1024 * 1024
    assert st["ns:default:evictions"] == "0"


def test_lease_ttl_caps_an_unfilled_placeholder(node):
    http(node.admin, "PUT", "/v1/namespaces/lt", {"lease_ttl": 1})
    a, b = node.raw(), node.raw()
    assert "W" in a.meta("mg lt:k v c N300").flags  # a wins and never fills
    assert "Z" in b.meta("mg lt:k v c N300").flags
    # after lease_ttl the placeholder is gone and another client can win
    wait_until(lambda: "W" in b.meta("mg lt:k v c N300").flags, timeout=5,
               message="a new win once the 1 s lease_ttl of the unfilled placeholder passed")


def test_stale_ttl_bounds_how_long_an_invalidated_value_is_served(node):
    http(node.admin, "PUT", "/v1/namespaces/st", {"stale_ttl": 7})
    r = node.raw()
    assert r.meta("ms st:k 3 T3600", b"old").code == "HD"
    assert r.meta("md st:k I").code == "HD"
    got = r.meta("mg st:k v t")
    assert "X" in got.flags and got.value == b"old"
    assert int(got.flags["t"]) in (6, 7), f"stale value kept for stale_ttl, not its TTL: {got.line}"


def test_new_namespaces_default_to_s3fifo(node):
    """s3fifo is the default policy: it has the lowest miss ratio in scripts/bench-hitratio.sh."""
    assert json.loads(http(node.admin, "PUT", "/v1/namespaces/plain", {})[1])["eviction"] == "s3fifo"
    assert json.loads(http(node.admin, "GET", "/v1/namespaces/default")[1])["eviction"] == "s3fifo"


# --- flush_ns <namespace> [noreply] on the data port ---------------------------------------------

def test_flush_ns_drops_only_that_namespaces_keys(node):
    for name in ("catalog", "users"):
        assert http(node.admin, "PUT", f"/v1/namespaces/{name}", {})[0] == 201
    r = node.raw()
    keys = [f"catalog:{i}" for i in range(50)]
    others = [f"users:{i}" for i in range(50)] + ["plain", "unknownprefix:1"]
    for k in keys + others:
        assert r.store("set", k, "v") == "STORED"
    assert r.cmd("flush_ns catalog") == "OK"
    assert r.get(*keys) == []
    assert sorted(k for k, *_ in r.get(*others)) == sorted(others)
    # a key stored after the flush, in the same second, lives
    assert r.store("set", "catalog:new", "v") == "STORED"
    assert [k for k, *_ in r.get("catalog:new")] == ["catalog:new"]


def test_flush_ns_noreply_flushes_and_answers_nothing(node):
    assert http(node.admin, "PUT", "/v1/namespaces/catalog", {})[0] == 201
    r = node.raw()
    assert r.store("set", "catalog:1", "v") == "STORED"
    assert r.store("set", "other:1", "v") == "STORED"
    r.send(b"flush_ns catalog noreply\r\nflush_ns nosuch noreply\r\nget catalog:1 other:1\r\n")
    assert [k for k, *_ in r.read_get_reply()] == ["other:1"]


def test_flush_ns_default_flushes_keys_of_no_namespace(node):
    assert http(node.admin, "PUT", "/v1/namespaces/catalog", {})[0] == 201
    r = node.raw()
    for k in ("plain", "nosuch:1", "catalog:1"):
        assert r.store("set", k, "v") == "STORED"
    assert r.cmd("flush_ns default") == "OK"
    assert [k for k, *_ in r.get("plain", "nosuch:1", "catalog:1")] == ["catalog:1"]


@pytest.mark.parametrize("line, reply", [
    ("flush_ns nosuch", "CLIENT_ERROR unknown namespace"),
    ("flush_ns bad/name", "CLIENT_ERROR unknown namespace"),
    ("flush_ns catalog extra", "CLIENT_ERROR bad command line format"),
    ("flush_ns", "ERROR"),
    ("flush_ns a b c", "ERROR"),
])
def test_flush_ns_bad_requests_are_errors_and_flush_nothing(node, line, reply):
    assert http(node.admin, "PUT", "/v1/namespaces/catalog", {})[0] == 201
    r = node.raw()
    assert r.store("set", "catalog:1", "v") == "STORED"
    assert r.cmd(line) == reply
    assert [k for k, *_ in r.get("catalog:1")] == ["catalog:1"]
