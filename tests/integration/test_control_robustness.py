"""shoal-control under bad input (design.md's reliability rules): thousands of random bodies,
paths and methods get a 4xx with a JSON error naming a field and a rule, never a crash or a 5xx,
and change nothing unless they were valid."""

import json
import random

import pytest

VALUES = [None, True, False, 0, 1, 2, -1, 3, 60, 2592000, 2592001, 1 << 20, 1 << 62, 1.5, "",
          "main", "x" * 70, "lru", "s3fifo", "127.0.0.1:1", "127.0.0.1:0", "[::1]:5", "a b",
          [], ["127.0.0.1:2"], [{"node": "127.0.0.1:3"}], {}, {"node": 1}, "\u00e9t\u00e9"]
FIELDS = ["name", "pool", "team", "memory", "copies", "eviction", "default_ttl", "max_ttl",
          "lease_ttl", "stale_ttl", "lease_period", "max_value_bytes", "ops_per_sec",
          "bytes_per_sec", "nodes", "node", "admin", "gutter", "gutter_ttl", "zzz"]
PATHS = ["/v1/namespaces", "/v1/namespaces/default", "/v1/namespaces/r{}", "/v1/pools",
         "/v1/pools/main", "/v1/pools/main/nodes", "/v1/pools/main/nodes/127.0.0.1:{}",
         "/v1/pools/p{}/nodes", "/v1/topology?after={}", "/v1/namespaces/a/b"]


def random_body(rng):
    kind = rng.random()
    if kind < 0.05:
        return rng.choice(["{", "[]", "null", "\"x\"", "{\"a\":1,\"a\":2}", "\x00", "{}" * 3])
    body = {f: rng.choice(VALUES) for f in rng.sample(FIELDS, rng.randint(0, 5))}
    if rng.random() < 0.5:
        body["name"] = rng.choice(["r1", "r2", "p1", "main", "default"])
    if rng.random() < 0.5:
        body["pool"] = "main"
    return body


def test_random_requests_never_crash_or_5xx(start_control):
    ctl = start_control("--poll-timeout", "1")
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:1", "127.0.0.1:2"]})
    rng = random.Random(1313)
    ok = refused = 0
    for _ in range(1500):
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH"])
        path = rng.choice(PATHS).replace("{}", str(rng.randint(0, 3)))
        if "after=" in path:  # a poll that is answered at once, or refused
            method = "GET"
            path = "/v1/topology?after=" + rng.choice(["0", "x", "-1", "", "1e3", "0x10"])
        before = ctl.version()
        status, body = ctl.request(method, path, None if method in ("GET", "DELETE") else random_body(rng))
        assert status < 500, (method, path, status, body)
        if status >= 400:
            refused += 1
            assert isinstance(body, dict) and body.get("error"), (method, path, body)
            if method not in ("GET",) and status != 405 and "rule" in body:
                assert ctl.version() == before, (method, path, body)
        else:
            ok += 1
    assert ctl.alive()
    assert ok > 50 and refused > 500
    doc = ctl.topology()
    assert "default" in doc["namespaces"] and doc["pools"]["main"]["nodes"]
