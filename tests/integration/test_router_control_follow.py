"""shoal-router --control URL: the router follows a control plane's topology by long-poll and
applies each newer version within a second; with the control plane down it keeps serving the
version it holds and catches up when it returns; an invalid document is skipped and the
running version kept. Also: the control plane's namespace fields in the topology document
(accepted, echoed, refused with the field named when wrongly typed), registration, and the
follower's figures on /metrics. The control plane is a stand-in (fakecontrol.py); the nodes
are real shoal-nodes. Skipped when SHOAL_TEST_SERVER=memcached."""

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import (ROUTER_BIN, Server, _check_survived, _die_with_parent, _register,
                      _wait_ready, topology)
from fakecontrol import FakeControl
from mcraw import McRaw, accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def control():
    c = FakeControl(hold=2.0)
    yield c
    c.stop()


@pytest.fixture
def start_follower(request, tmp_path):
    """Factory: start_follower(url, *flags, config=doc_or_None) -> (Server, admin port): a
    router with --control URL (none when url is None) and --config FILE when `config` is given,
    once it listens."""
    started = []

    def start(url, *extra, config=None):
        r, admin = spawn_follower(tmp_path, url, *extra, config=config, name=len(started))
        started.append(r)
        _register(request.node, r)
        return r, admin

    yield start
    _check_survived(started)


def spawn_follower(tmp_path, url, *extra, config=None, name=0):
    """A router as start_follower starts it, left for the caller to stop."""
    for attempt in range(3):
        port, admin = free_port(), free_port()
        args = [str(ROUTER_BIN), "-p", str(port), "-l", "127.0.0.1", "-t", "2",
                "--admin-port", str(admin), *(["--control", url] if url else []), *extra]
        if config is not None:
            path = tmp_path / f"topology-{name}-{attempt}.json"
            path.write_text(json.dumps(config))
            args += ["--config", str(path)]
        fd, stderr_path = tempfile.mkstemp(prefix="router-", suffix=".stderr", dir=tmp_path)
        with os.fdopen(fd, "w") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        if _wait_ready(proc, port, stderr_path):
            r = Server(args, port, proc, stderr_path)
            # the data port listens a moment before the admin port does
            wait_until(lambda: accepts(admin) or not r.alive(), message="the admin port")
            return r, admin
        text = Path(stderr_path).read_text(errors="replace")
        if "in use" not in text.lower() or attempt == 2:
            pytest.fail(f"router exited with status {proc.returncode}: {' '.join(args)}\n{text}")
    raise AssertionError("unreachable")


def doc_for(nodes, version, **extra):
    return topology(nodes, version=version, **extra)


def version_of(admin):
    status, body = http(admin, "GET", "/v1/topology")
    assert status == 200, body
    return json.loads(body)["version"]


def metric(admin, name):
    status, body = http(admin, "GET", "/metrics")
    assert status == 200
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    assert m, f"/metrics has {name}"
    return float(m.group(1))


def holds(node, key, value):
    with McRaw(node.host, node.port) as c:
        got = c.meta(f"mg {key} v")
        return got.code == "VA" and got.value == value


def test_router_without_config_starts_from_the_control_planes_document(start_server, control,
                                                                        start_follower):
    a = start_server()
    control.publish(doc_for([a], 4))
    router, admin = start_follower(control.url)
    assert version_of(admin) == 4
    r = router.raw()
    assert r.store("set", "k1", "v") == "STORED"
    assert holds(a, "k1", b"v")


def test_new_version_is_applied_within_a_second(start_server, control, start_follower):
    a, b = start_server(), start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url)
    r = router.raw()
    assert r.store("set", "moving", "0") == "STORED" and holds(a, "moving", b"0")
    wait_until(lambda: control.gets and control.gets[-1] == 1, message="the router's long poll")
    t0 = time.monotonic()
    control.publish(doc_for([b], 2))
    n = [0]

    def routed_to_b():
        n[0] += 1
        value = str(n[0])
        assert r.store("set", "moving", value) == "STORED"
        return holds(b, "moving", value.encode())
    wait_until(routed_to_b, timeout=5, interval=0.005, message="keys routed to the new node")
    took = time.monotonic() - t0
    assert took < 1.0, f"version 2 took {took:.3f}s from publishing to routing keys to the new node"
    assert version_of(admin) == 2


def test_control_plane_down_keeps_the_last_version_then_catches_up(start_server, control,
                                                                   start_follower):
    a, b = start_server(), start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url, "--control-backoff-max-ms", "200")
    wait_until(lambda: metric(admin, "shoal_router_control_up") == 1, message="control_up 1")
    control.stop()
    wait_until(lambda: metric(admin, "shoal_router_control_up") == 0, message="control_up 0")
    wait_until(lambda: metric(admin, "shoal_router_control_failures") >= 4,
               message="several retries while the control plane is down")
    r = router.raw()
    assert r.store("set", "during", "x") == "STORED", "still serving with the last version"
    assert holds(a, "during", b"x") and version_of(admin) == 1
    log = router.stderr_text()
    assert log.count("unreachable") == 1, f"one line when it goes away:\n{log}"

    control.publish(doc_for([b], 2))  # changed while the router could not see it
    control.start()
    wait_until(lambda: version_of(admin) == 2, message="caught up with version 2")
    assert r.store("set", "after", "y") == "STORED" and holds(b, "after", b"y")
    assert metric(admin, "shoal_router_control_up") == 1
    log = router.stderr_text()
    assert log.count("answers again") == 1, f"one line when it comes back:\n{log}"


def test_error_statuses_count_as_down_and_keep_the_version(start_server, control, start_follower):
    a = start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url, "--control-backoff-max-ms", "200")
    wait_until(lambda: metric(admin, "shoal_router_control_up") == 1, message="control_up 1")
    control.fail_status = 500
    control.publish(doc_for([a], 2))  # wakes the held poll, whose answer is now a 500
    wait_until(lambda: metric(admin, "shoal_router_control_failures") >= 3,
               message="several failed retries")
    assert metric(admin, "shoal_router_control_up") == 0
    assert version_of(admin) == 1
    control.fail_status = None
    wait_until(lambda: version_of(admin) == 2, message="version 2 once the control plane is well")
    log = router.stderr_text()
    assert log.count("unreachable") == 1 and log.count("answers again") == 1, \
        f"one line when it goes, one when it comes back, not one per retry:\n{log}"


def test_invalid_document_is_skipped_and_the_running_version_kept(start_server, control,
                                                                  start_follower):
    a, b = start_server(), start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url)
    bad = doc_for([b], 2)
    bad["namespaces"]["default"]["pool"] = "nope"
    control.publish(bad)
    wait_until(lambda: "keeping version 1" in router.stderr_text(), message="the refusal logged")
    assert "namespaces.default.pool" in router.stderr_text()
    r = router.raw()
    assert r.store("set", "kept", "1") == "STORED" and holds(a, "kept", b"1")
    assert version_of(admin) == 1
    wait_until(lambda: control.gets and control.gets[-1] == 2,
               message="the router polls after the refused version, not for it again")
    control.publish(doc_for([b], 3))
    wait_until(lambda: version_of(admin) == 3, message="the next valid version applied")
    assert metric(admin, "shoal_router_topology_reload_failures") == 1, \
        "the invalid document was refused once, not fetched again and again"


def test_new_namespace_fields_are_accepted_and_echoed(start_server, control, start_follower):
    a = start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url)
    doc = doc_for([a], 2)
    doc["namespaces"]["catalog"] = {"pool": "main", "team": "shop", "memory": 64 << 20,
                                    "copies": 2, "eviction": "s3fifo", "lease_ttl": 10,
                                    "stale_ttl": 30, "lease_period": 3600, "max_ttl": 600}
    doc["namespaces"]["default"].update(team="core", memory=0, copies=1, eviction="lru")
    control.publish(doc)
    wait_until(lambda: version_of(admin) == 2, message="version 2")
    status, body = http(admin, "GET", "/v1/topology")
    assert json.loads(body) == doc, "GET /v1/topology returns every field as loaded"


@pytest.mark.parametrize("field,value", [
    ("team", 7), ("team", "x" * 65), ("memory", -1), ("memory", "64m"),
    ("copies", 3), ("copies", "2"), ("eviction", "fifo"), ("eviction", 1), ("lease_ttl", "10"),
    ("stale_ttl", 86401), ("lease_ttl", 3601), ("lease_period", 1.5), ("lease_period", True),
])
def test_wrong_typed_new_fields_are_refused_naming_the_field(cluster, field, value):
    doc = topology(cluster.nodes, version=2)
    doc["namespaces"]["catalog"] = {"pool": "main", field: value}
    status, body = http(cluster.admin_port, "PUT", "/v1/topology", doc)
    assert status == 400 and f"namespaces.catalog.{field}" in body, body
    assert cluster.version() == 1


def test_metrics_show_the_version_and_the_followers_figures(start_server, control,
                                                            start_follower):
    a = start_server()
    control.publish(doc_for([a], 9))
    router, admin = start_follower(control.url)
    wait_until(lambda: metric(admin, "shoal_router_control_polls") >= 1, message="a poll")
    assert metric(admin, "shoal_router_topology_version") == 9
    assert metric(admin, "shoal_router_control_up") == 1
    assert metric(admin, "shoal_router_control_failures") == 0
    assert metric(admin, "shoal_router_control_last_success_age_seconds") < 5
    control.publish(doc_for([a], 10))
    wait_until(lambda: metric(admin, "shoal_router_topology_version") == 10, message="version 10")
    assert metric(admin, "shoal_router_control_applied") == 1


def test_router_registers_with_the_control_plane(start_server, control, start_follower):
    a = start_server()
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url, "--client-id", "app-7")
    wait_until(lambda: control.registrations, message="a registration")
    assert control.registrations[0] == {"id": "app-7", "listen": f"127.0.0.1:{router.port}",
                                        "admin": f"127.0.0.1:{admin}"}


def test_control_plane_without_registration_is_followed_all_the_same(start_server, control,
                                                                     start_follower):
    a, b = start_server(), start_server()
    control.routers_status = 404
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url)
    control.publish(doc_for([b], 2))
    wait_until(lambda: version_of(admin) == 2, message="version 2")
    assert metric(admin, "shoal_router_control_failures") == 0


def test_config_file_first_then_the_control_plane(start_server, control, start_follower):
    a, b = start_server(), start_server()
    control.publish(doc_for([b], 5))
    router, admin = start_follower(control.url, config=doc_for([a], 1))
    wait_until(lambda: version_of(admin) == 5, message="the control plane's version 5")
    r = router.raw()
    assert r.store("set", "k", "v") == "STORED" and holds(b, "k", b"v")


def test_control_url_from_the_options_file(start_server, control, start_follower, tmp_path):
    a = start_server()
    control.publish(doc_for([a], 3))
    opts = tmp_path / "router.conf"
    opts.write_text(f"control = {control.url}\ncontrol_wait_ms = 3000\n")
    router, admin = start_follower(None, "--options", str(opts))
    assert version_of(admin) == 3
    control.publish(doc_for([a], 4))
    wait_until(lambda: version_of(admin) == 4, message="followed from the options file's URL")


def test_start_waits_for_the_first_document(start_server, control, start_follower):
    a = start_server()

    def publish_once_asked():
        wait_until(lambda: control.gets, message="the router asking")
        control.publish(doc_for([a], 2))
    threading.Thread(target=publish_once_asked, daemon=True).start()
    router, admin = start_follower(control.url, "--control-wait-ms", "8000")
    assert version_of(admin) == 2
    assert "waiting for the control plane" in router.stderr_text()


def test_start_gives_up_without_a_document(control, tmp_path):
    t0 = time.monotonic()
    res = subprocess.run([str(ROUTER_BIN), "-p", "0", "--control", control.url,
                          "--control-wait-ms", "500"], capture_output=True, text=True, timeout=10)
    assert res.returncode == 2 and "503" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 5


def test_control_url_must_be_http(tmp_path):
    res = subprocess.run([str(ROUTER_BIN), "-p", "0", "--control", "ftp://x"], capture_output=True,
                         text=True, timeout=10)
    assert res.returncode == 2 and "--control" in res.stderr


def test_sigterm_ends_a_held_poll_at_once(start_server, tmp_path):
    a = start_server()
    control = FakeControl(hold=30.0)
    proc = None
    try:
        control.publish(doc_for([a], 1))
        with open(tmp_path / "router.stderr", "w") as err:
            proc = subprocess.Popen([str(ROUTER_BIN), "-p", "0", "--control", control.url],
                                    stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    preexec_fn=_die_with_parent)
        wait_until(lambda: control.gets and control.gets[-1] == 1, message="a held long poll")
        t0 = time.monotonic()
        proc.terminate()
        assert proc.wait(10) == 0, (tmp_path / "router.stderr").read_text()
        took = time.monotonic() - t0
        assert took < 1.0, f"exit took {took:.3f}s with a poll held for 30 s"
    finally:
        if proc and proc.poll() is None:
            proc.kill()
        control.stop()


def test_sighup_without_a_config_file_changes_nothing(start_server, control, start_follower):
    a = start_server()
    control.publish(doc_for([a], 3))
    router, admin = start_follower(control.url)
    router.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "no --config file" in router.stderr_text(), message="SIGHUP logged")
    assert version_of(admin) == 3 and router.alive()


def test_router_follows_the_real_control_plane(start_server, start_control, start_follower):
    """End to end with shoal-control itself: the router starts from its document, and a node
    added through the API takes its share of the keys at the router within 1 s."""
    a, b = start_server(), start_server()
    ctl = start_control()
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [f"127.0.0.1:{a.port}"]})
    assert status in (200, 201), body
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "team": "shop", "eviction": "lfu"})
    assert status == 201, body
    router, admin = start_follower(f"http://127.0.0.1:{ctl.port}")
    doc = json.loads(http(admin, "GET", "/v1/topology")[1])
    assert doc["version"] == ctl.topology()["version"]
    assert doc["namespaces"]["catalog"]["team"] == "shop"
    r = router.raw()
    keys = [f"catalog:k{i}" for i in range(200)]
    for k in keys:
        assert r.store("set", k, "v") == "STORED"
    assert all(holds(a, k, b"v") for k in keys)
    t0 = time.monotonic()
    status, body = ctl.post("/v1/pools/main/nodes", {"node": f"127.0.0.1:{b.port}"})
    assert status in (200, 201), body
    version = ctl.topology()["version"]
    wait_until(lambda: version_of(admin) == version, timeout=5, interval=0.01,
               message="the router applying the new version")
    took = time.monotonic() - t0
    assert took < 1.0, f"the node's addition took {took:.3f}s to reach the router"
    for k in keys:
        assert r.store("set", k, "w") == "STORED"
    on_b = [k for k in keys if holds(b, k, b"w")]
    assert 60 <= len(on_b) <= 140, f"{len(on_b)} of 200 keys moved to the new node"


def test_shutdown_while_metrics_are_scraped_exits_cleanly(start_server, control, tmp_path):
    from mcraw import scrape_while_stopping
    node = start_server()
    control.publish(doc_for([node], 1))
    for i in range(5):
        r, admin = spawn_follower(tmp_path, control.url, name=i)
        wait_until(lambda: version_of(admin) == 1, message="version 1")
        status = scrape_while_stopping(r.proc, admin)
        err = r.stderr_text()
        assert status == 0 and "Sanitizer" not in err and "runtime error" not in err, err


def test_registration_refused_for_want_of_a_token_is_logged_once_at_info(start_server, control,
                                                                          start_follower):
    a = start_server()
    control.routers_status = 401  # a control plane with --auth-file, the router without a token
    control.publish(doc_for([a], 1))
    router, admin = start_follower(control.url, "-v")
    wait_until(lambda: control.registrations, message="a registration")
    wait_until(lambda: version_of(admin) == 1, message="version 1 followed all the same")
    control.stop()
    wait_until(lambda: metric(admin, "shoal_router_control_up") == 0, message="control away")
    control.start()
    wait_until(lambda: len(control.registrations) >= 2, message="registration when it is back")
    wait_until(lambda: metric(admin, "shoal_router_control_up") == 1, message="control back")
    err = router.stderr_text()
    lines = [l for l in err.splitlines() if "admin token only" in l]
    assert len(lines) == 1 and " info:" in lines[0], err
    assert "refused the registration" not in err


def test_router_starts_from_the_second_control_url_when_the_first_does_not_answer(
        start_server, control, start_follower):
    a = start_server()
    control.publish(doc_for([a], 6))
    dead = f"http://127.0.0.1:{free_port()}"
    router, admin = start_follower(f"{dead},{control.url}")
    assert version_of(admin) == 6
    control.publish(doc_for([a], 7))
    wait_until(lambda: version_of(admin) == 7, timeout=3, message="version 7 from the live one")
